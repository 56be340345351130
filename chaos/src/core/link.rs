//! What link faults can do to a link, as the seam between the nemeses and
//! whatever carries the traffic: three small traits, each implemented by a
//! backend (the TCP fault proxy of local runs, iptables rules in a
//! container's network namespace), so that the nemeses know no backend.

use std::sync::Arc;
use std::time::Duration;

use crate::core::roles::BoxFuture;

/// A link the partition nemesis can cut, both ways.
pub trait Link: Send + Sync + std::fmt::Debug {
    fn cut(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// Restores the link. Idempotent: healing a whole link is always safe.
    fn heal(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// [`Link::heal`] without a runtime, for the last-resort heal of a run
    /// that unwinds.
    fn heal_blocking(&self);
    /// For a link that chooses what to cut as the cut comes (a Kafka
    /// cluster's `leader<->all`): the link it cut last, for the record.
    fn chose(&self) -> Option<String> {
        None
    }
}

/// A link the delay nemesis can slow down: every chunk of an answer waits.
/// In-process (a proxy's switch), so neither call waits.
pub trait Slow: Send + Sync + std::fmt::Debug {
    fn slow(&self, by: Duration);
    /// Ends the delay; a cut of the same link is the partition's to heal.
    fn unslow(&self);
}

/// A link that can lose packets at random, both ways.
pub trait Lossy: Send + Sync + std::fmt::Debug {
    fn lose(&self, probability: f64) -> BoxFuture<'_, anyhow::Result<()>>;
    /// Ends the loss. Idempotent.
    fn heal_loss(&self) -> BoxFuture<'_, anyhow::Result<()>>;
}

pub type SharedLink = Arc<dyn Link>;
pub type SharedSlow = Arc<dyn Slow>;
pub type SharedLossy = Arc<dyn Lossy>;
