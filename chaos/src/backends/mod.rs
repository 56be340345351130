//! What runs a system's nodes and cuts its links.
//!
//! - [`local`]: child processes, signalled as process groups.
//! - [`docker`]: containers through the Docker API (kill, pause, iptables).
//! - [`postgres`]: a PostgreSQL server the harness crashes and restarts.
//! - [`proxy`]: the TCP fault proxy (partitions, delay).
//! - [`ready`]: how to tell that a node serves, after a start or a restart.

pub mod docker;
pub mod local;
pub mod postgres;
pub mod proxy;
pub mod ready;
