//! The store of the reference pipeline: the source-of-truth `orders`, the queue,
//! the inbox, the projection with its ledger, and the dead letters, over sqlx on
//! SQLite (`sqlite://PATH`, the embedded default) or PostgreSQL (`postgres://…`).
//!
//! Every operation that must be atomic is one transaction here, and only this
//! crate writes these tables. Times come from the database clock, so a worker's
//! clock never decides whether a lease has expired.
//!
//! # Layout
//!
//! - [`Store`]: connecting, migrating, and the operations (`place_order`,
//!   `lease`, `apply`, `ack`, `fail`, `redrive`, `reconcile`, `final_state`).
//! - [`DbUrl`]: a database URL parsed once, with its [`DbKind`].
//! - [`model`]: the values that cross the boundary.
//! - [`bug`]: the bug modes, each a known mistake that can be switched back on.
//! - [`retry`]: backoff for failed deliveries.
//! - `sql`: the statements, per backend where they differ.
//! - [`Baseline`]: the raw-SQL baselines of `haunt bench pipeline` (and the
//!   bench's table resets), kept here so that only this crate speaks the tables.

mod baseline;
pub mod bug;
mod db_url;
pub mod model;
pub mod retry;
mod sql;
mod store;

pub use baseline::{Baseline, DrainCounts, QueueHold};
pub use bug::Bug;
pub use db_url::{DbKind, DbUrl};
pub use model::*;
pub use retry::{Backoff, ErrorWait, InjectedErrors, Rng};
pub use sql::values as sql_values;
pub use store::{Store, StoreOptions};

/// Errors at the store's boundary. Whether a failed write may have committed
/// matters to the API (it decides between "certainly failed" and "unknown"), so
/// database errors say on which side of the commit they happened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL {0:?}: expected sqlite://PATH or postgres://USER@HOST/DB")]
    Url(String),
    /// A PostgreSQL URL whose `sslmode` demands TLS, in a build without it.
    #[error(
        "{0}: its sslmode asks for TLS, which this build of haunt does not have; \
         build haunt with `--features postgres-tls` (`cargo build --release --features postgres-tls`)"
    )]
    NoTls(String),
    #[error("connecting to the database")]
    Connect(#[source] sqlx::Error),
    #[error("running migrations")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// The transaction never reached its commit: nothing was written.
    #[error("database error before commit (nothing written)")]
    NotCommitted(#[source] sqlx::Error),
    /// The commit was sent but its answer was lost: it may have taken effect.
    #[error("database error at commit (outcome unknown)")]
    CommitUnknown(#[source] sqlx::Error),
    #[error("corrupt row in {table}: {why}")]
    Corrupt { table: &'static str, why: String },
    #[error("writing the final state")]
    Sink(#[source] std::io::Error),
    /// A baseline of the bench refused what it was given; nothing was written.
    #[error("{0}")]
    Refused(String),
}

impl StoreError {
    /// True when the operation certainly wrote nothing.
    pub fn not_committed(&self) -> bool {
        matches!(self, StoreError::NotCommitted(_))
    }
}
