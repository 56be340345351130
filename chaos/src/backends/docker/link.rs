//! Links between a run's containers, cut or made lossy by iptables rules in
//! one container's network namespace (through a helper container that
//! shares it).

use std::sync::Arc;

use super::{DockerBackend, Helper, blocking};
use crate::core::roles::{BoxFuture, Node};

/// The far end of a link, seen from the container whose rules cut it.
#[derive(Debug, Clone)]
pub enum Peer {
    /// Another container of the run (the database).
    Node(Node),
    /// The host, through a published port: the harness's clients.
    Host { port: u16 },
    /// A fault proxy of the harness on the network's gateway, which the node
    /// calls (its link to another container of a system file).
    Harness { port: u16 },
}

/// A link cut by iptables rules in one container's network namespace. The
/// rules live in two chains of their own (`haunt-partition`, `haunt-loss`), so
/// healing one fault flushes only its chain. A container that is restarted gets
/// a fresh namespace, and with it a healed link.
#[derive(Debug)]
pub struct IptablesLink {
    backend: Arc<DockerBackend>,
    node: Node,
    peer: Peer,
}

/// Creates both chains on first use and hooks them into INPUT and OUTPUT.
const CHAINS: &str = "for c in haunt-partition haunt-loss; do \
    if iptables -N $c 2>/dev/null; then iptables -I INPUT -j $c && iptables -I OUTPUT -j $c || exit 1; fi; done";

impl IptablesLink {
    pub fn new(backend: Arc<DockerBackend>, node: Node, peer: Peer) -> IptablesLink {
        IptablesLink { backend, node, peer }
    }

    /// The match for packets from the peer, then for packets to it.
    async fn matches(&self) -> anyhow::Result<(String, String)> {
        Ok(match &self.peer {
            Peer::Node(peer) => {
                let ip = self.backend.ip_toward(&self.node, peer).await?;
                (format!("-s {ip}"), format!("-d {ip}"))
            }
            Peer::Host { port } => {
                let gw = self.backend.gateway(&self.node).await?;
                (format!("-s {gw} -p tcp --dport {port}"), format!("-d {gw} -p tcp --sport {port}"))
            }
            Peer::Harness { port } => {
                let gw = self.backend.gateway(&self.node).await?;
                (format!("-s {gw} -p tcp --sport {port}"), format!("-d {gw} -p tcp --dport {port}"))
            }
        })
    }

    async fn add(&self, chain: &str, extra: &str) -> anyhow::Result<()> {
        let (from, to) = self.matches().await?;
        let script =
            format!("{CHAINS}; iptables -A {chain} {from} {extra} -j DROP && iptables -A {chain} {to} {extra} -j DROP");
        self.backend.in_netns(&self.node, &script).await.map(drop)
    }

    /// Drops every packet both ways.
    pub async fn cut(&self) -> anyhow::Result<()> {
        self.add("haunt-partition", "").await
    }

    /// Drops each packet, both ways, with this probability.
    pub async fn lose(&self, probability: f64) -> anyhow::Result<()> {
        self.add("haunt-loss", &format!("-m statistic --mode random --probability {probability:.3}")).await
    }

    /// Flushes one chain. A container that is not running has nothing to heal
    /// (it gets a fresh namespace when it starts).
    async fn flush(&self, chain: &str) -> anyhow::Result<()> {
        match self.backend.in_netns(&self.node, &format!("iptables -F {chain} 2>/dev/null; true")).await {
            Err(e) if format!("{e:#}").contains("non running container") => Ok(()),
            other => other.map(drop),
        }
    }

    pub async fn heal(&self) -> anyhow::Result<()> {
        self.flush("haunt-partition").await
    }

    pub async fn heal_loss(&self) -> anyhow::Result<()> {
        self.flush("haunt-loss").await
    }
}

impl crate::core::link::Link for IptablesLink {
    fn cut(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(IptablesLink::cut(self))
    }
    fn heal(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(IptablesLink::heal(self))
    }
    /// Nothing for the backend's own containers: the rules live in the
    /// container's network namespace, which goes with the container when the
    /// backend drops. An adopted container outlives the run, so both chains
    /// are flushed.
    fn heal_blocking(&self) {
        if !self.backend.adopted() {
            return;
        }
        let helper = Helper {
            tools_image: &self.backend.tools_image,
            labels: self.backend.labels(None),
            target: self.backend.container(&self.node),
        };
        let script = "iptables -F haunt-partition 2>/dev/null; iptables -F haunt-loss 2>/dev/null; true";
        let _ = blocking(|docker| async move { helper.run(&docker, script).await });
    }
}

impl crate::core::link::Lossy for IptablesLink {
    fn lose(&self, probability: f64) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(IptablesLink::lose(self, probability))
    }
    fn heal_loss(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(IptablesLink::heal_loss(self))
    }
}
