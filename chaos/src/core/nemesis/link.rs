//! Faults of links, over the link seam ([`crate::core::link`]): a cut, a
//! delay, random packet loss. Each knows only the trait it needs.

use std::time::Duration;

use anyhow::Context;

use super::aim::Aim;
use crate::core::link::{SharedLink, SharedLossy, SharedSlow};
use crate::core::roles::{BoxFuture, Nemesis};

/// The link named `target` among `links`.
fn find<'l, T>(links: &'l [(String, T)], target: &str) -> anyhow::Result<&'l T> {
    links.iter().find(|(n, _)| n == target).map(|(_, l)| l).context("unknown link")
}

/// The names of `links`, the targets of their fault.
fn names<T>(links: &[(String, T)]) -> Vec<String> {
    links.iter().map(|(n, _)| n.clone()).collect()
}

/// Cuts one link: nothing crosses it, both ways, until it heals.
#[derive(Debug)]
pub struct PartitionNemesis {
    links: Vec<(String, SharedLink)>,
    /// To cut while an end of the link holds work at a point (see [`Aim::at_link`]).
    aim: Option<Aim>,
    /// What the last cut chose to cut, where its link chooses (`leader<->all`).
    chose: std::sync::Mutex<Option<String>>,
}

impl PartitionNemesis {
    /// `links`: a name such as `client<->api` and the link itself.
    pub fn new(links: Vec<(String, SharedLink)>) -> Self {
        PartitionNemesis { links, aim: None, chose: Default::default() }
    }

    /// Every other cut waits for an end of its link with hold points to hold
    /// work there.
    pub fn aimed(self, aim: Aim) -> Self {
        PartitionNemesis { aim: Some(aim), ..self }
    }
}

/// The two ends of a link's name, `worker-1<->redis`.
fn ends(target: &str) -> Option<[&str; 2]> {
    target.split_once("<->").map(|(a, b)| [a, b])
}

impl Nemesis for PartitionNemesis {
    fn name(&self) -> &'static str {
        crate::core::fault::Fault::Partition.name()
    }
    fn targets(&self) -> Vec<String> {
        names(&self.links)
    }
    /// The hold's answer, and the link a choosing link cut (`"link":
    /// "broker-2<->all"` for `leader<->all`).
    fn take_aim(&self) -> Option<serde_json::Value> {
        let aim = Aim::take(self.aim.as_ref());
        match self.chose.lock().unwrap_or_else(|p| p.into_inner()).take() {
            None => aim,
            Some(link) => {
                let mut aim = aim.unwrap_or_else(|| serde_json::json!({}));
                aim["link"] = link.into();
                Some(aim)
            }
        }
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let link = find(&self.links, target)?;
            if let Some(ends) = ends(target) {
                Aim::at_link(self.aim.as_ref(), ends).await;
            }
            link.cut().await?;
            *self.chose.lock().unwrap_or_else(|p| p.into_inner()) = link.chose();
            Ok(())
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            for (_, link) in &self.links {
                link.heal().await?;
            }
            Ok(())
        })
    }
    fn heal_blocking(&self) {
        for (_, link) in &self.links {
            link.heal_blocking();
        }
    }
}

/// Slows a link: every chunk of an answer waits `delay`. Longer than the
/// client's timeout, requests commit but their answers come too late, and the
/// client must retry an order whose fate it does not know.
#[derive(Debug)]
pub struct DelayNemesis {
    links: Vec<(String, SharedSlow)>,
    delay: Duration,
}

impl DelayNemesis {
    pub fn new(links: Vec<(String, SharedSlow)>, delay: Duration) -> Self {
        DelayNemesis { links, delay }
    }
}

impl Nemesis for DelayNemesis {
    fn name(&self) -> &'static str {
        crate::core::fault::Fault::Delay.name()
    }
    fn targets(&self) -> Vec<String> {
        names(&self.links)
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            find(&self.links, target)?.slow(self.delay);
            Ok(())
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        self.heal_blocking();
        Box::pin(async { Ok(()) })
    }
    fn heal_blocking(&self) {
        for (_, link) in &self.links {
            link.unslow();
        }
    }
}

/// Random packet loss on a link: TCP retransmits, so requests slow down and
/// some time out, without a clean cut.
#[derive(Debug)]
pub struct LossNemesis {
    links: Vec<(String, SharedLossy)>,
    probability: f64,
}

impl LossNemesis {
    pub fn new(links: Vec<(String, SharedLossy)>, probability: f64) -> Self {
        LossNemesis { links, probability }
    }
}

impl Nemesis for LossNemesis {
    fn name(&self) -> &'static str {
        crate::core::fault::Fault::Loss.name()
    }
    fn targets(&self) -> Vec<String> {
        names(&self.links)
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { find(&self.links, target)?.lose(self.probability).await })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            for (_, link) in &self.links {
                link.heal_loss().await?;
            }
            Ok(())
        })
    }
}
