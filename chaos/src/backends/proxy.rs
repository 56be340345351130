//! The harness's side of the fault proxy ([`haunt_proxy`], a crate of its
//! own so that its byte loop is compiled at full optimisation): its handle
//! and the links a nemesis cuts, heals and slows.

use std::sync::Arc;
use std::time::Duration;

use crate::core::roles::BoxFuture;
pub use haunt_proxy::{FaultProxy, ProxyMode};

/// A shared handle, for nemeses.
pub type SharedProxy = Arc<FaultProxy>;

impl crate::core::link::Link for FaultProxy {
    fn cut(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        self.set(ProxyMode::Partition);
        Box::pin(async { Ok(()) })
    }
    fn heal(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        crate::core::link::Link::heal_blocking(self);
        Box::pin(async { Ok(()) })
    }
    fn heal_blocking(&self) {
        // A delay on the same proxy is another nemesis's to heal.
        if self.mode() == ProxyMode::Partition {
            self.set(ProxyMode::Pass);
        }
    }
}

impl crate::core::link::Slow for FaultProxy {
    fn slow(&self, by: Duration) {
        self.set(ProxyMode::Delay(by));
    }
    fn unslow(&self) {
        // A partition on the same proxy is another nemesis's to heal.
        if self.mode() != ProxyMode::Partition {
            self.set(ProxyMode::Pass);
        }
    }
}

/// Several proxies as one link: a cut cuts them all, a heal heals them all.
/// How a Kafka cluster's links are named by what they join (`worker-1<->broker`
/// over a client's proxy to each broker, `broker-1<->brokers` over a node's
/// proxies to and from its peers). Two groups may share a proxy: a fault on
/// one, healed, heals that proxy for the other too.
#[derive(Debug, Clone)]
pub struct ProxyGroup(pub Vec<SharedProxy>);

impl crate::core::link::Link for ProxyGroup {
    fn cut(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        for p in &self.0 {
            p.set(ProxyMode::Partition);
        }
        Box::pin(async { Ok(()) })
    }
    fn heal(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        crate::core::link::Link::heal_blocking(self);
        Box::pin(async { Ok(()) })
    }
    fn heal_blocking(&self) {
        for p in &self.0 {
            crate::core::link::Link::heal_blocking(p.as_ref());
        }
    }
}

impl crate::core::link::Slow for ProxyGroup {
    fn slow(&self, by: Duration) {
        for p in &self.0 {
            crate::core::link::Slow::slow(p.as_ref(), by);
        }
    }
    fn unslow(&self) {
        for p in &self.0 {
            crate::core::link::Slow::unslow(p.as_ref());
        }
    }
}
