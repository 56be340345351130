//! The client of the admin endpoints (`docs/admin.md`): the fault switches
//! (`POST /admin/faults`), the hold points (`POST /admin/hold`) and the list
//! of a node's points (`GET /admin/points`). haunt's own services answer it,
//! and so does any node of a system file that declares an `admin` URL. The
//! system seam hands it to the nemeses that flip switches and aim kills
//! ([`crate::core::system::Switches`]).

use std::time::Duration;

use anyhow::Context;
use serde_json::json;

/// One node's admin endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminNode {
    pub name: String,
    /// Its base URL: `http://127.0.0.1:PORT`.
    pub base: String,
    /// The hold points it offers, by name. Empty: it holds at the one point
    /// it has (haunt's own workers), and a hold names none.
    pub points: Vec<String>,
}

impl AdminNode {
    pub fn new(name: impl Into<String>, base: impl Into<String>) -> Self {
        AdminNode { name: name.into(), base: base.into(), points: Vec::new() }
    }
}

/// Talks to the admin endpoints of some nodes, behind one bearer token.
#[derive(Debug, Clone)]
pub struct Admin {
    http: reqwest::Client,
    token: String,
    pub nodes: Vec<AdminNode>,
}

impl Admin {
    pub fn new(token: String, nodes: Vec<AdminNode>) -> anyhow::Result<Self> {
        // Short: a node that does not answer at once is paused or dead, and the
        // nemesis must not stall the schedule waiting for it.
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        Ok(Admin { http, token, nodes })
    }

    /// The same client over the nodes that `keep` keeps.
    pub fn only(&self, keep: impl Fn(&AdminNode) -> bool) -> Admin {
        Admin {
            http: self.http.clone(),
            token: self.token.clone(),
            nodes: self.nodes.iter().filter(|n| keep(n)).cloned().collect(),
        }
    }

    fn node(&self, name: &str) -> anyhow::Result<&AdminNode> {
        self.nodes.iter().find(|n| n.name == name).with_context(|| format!("{name} has no admin endpoint here"))
    }

    /// Whether `node` is one of these nodes.
    pub fn has(&self, node: &str) -> bool {
        self.nodes.iter().any(|n| n.name == node)
    }

    /// The hold points `node` offers (empty for haunt's own workers).
    pub fn points(&self, node: &str) -> &[String] {
        self.nodes.iter().find(|n| n.name == node).map_or(&[], |n| &n.points)
    }

    /// Asks `node` to hold the next piece of work that reaches its hold
    /// `point` (`POST /admin/hold`; `None`: the node's only point) and waits
    /// for its answer: `{"held": true, "point": …, …}` once work holds still
    /// there for `hold`, `{"held": false}` when none came within `wait`; an
    /// error when no answer came within `wait + margin`.
    pub async fn hold(
        &self,
        node: &str,
        point: Option<&str>,
        wait: Duration,
        margin: Duration,
        hold: Duration,
    ) -> anyhow::Result<serde_json::Value> {
        let base = &self.node(node)?.base;
        let mut body = json!({"wait_ms": wait.as_millis() as u64, "hold_ms": hold.as_millis() as u64});
        if let Some(point) = point {
            body["point"] = json!(point);
        }
        let r = self
            .http
            .post(format!("{base}/admin/hold"))
            .bearer_auth(&self.token)
            .json(&body)
            // The answer comes after up to `wait`: past the client's usual bound.
            .timeout(wait + margin)
            .send()
            .await
            .with_context(|| format!("asking {node} to hold"))?;
        anyhow::ensure!(r.status().is_success(), "{node} refused the hold: {}", r.status());
        r.json().await.with_context(|| format!("{node}'s answer to a hold"))
    }

    /// `GET {path}` of `node`'s admin endpoint, as JSON.
    pub async fn get(&self, node: &str, path: &str) -> anyhow::Result<serde_json::Value> {
        let base = &self.node(node)?.base;
        let r = self
            .http
            .get(format!("{base}{path}"))
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("GET {base}{path}"))?;
        anyhow::ensure!(r.status().is_success(), "GET {base}{path} answered {}", r.status());
        r.json().await.with_context(|| format!("GET {base}{path}: not JSON"))
    }

    pub async fn set(&self, node: &str, settings: serde_json::Value) -> anyhow::Result<()> {
        let base = &self.node(node)?.base;
        let r = self
            .http
            .post(format!("{base}/admin/faults"))
            .bearer_auth(&self.token)
            .json(&settings)
            .send()
            .await
            .with_context(|| format!("setting faults on {node}"))?;
        anyhow::ensure!(r.status().is_success(), "{node} refused the fault switch: {}", r.status());
        Ok(())
    }

    /// Sets `settings` on every node; reports the first failure after trying all.
    pub async fn set_all(&self, settings: serde_json::Value) -> anyhow::Result<()> {
        let mut first_error = None;
        for node in &self.nodes {
            if let Err(e) = self.set(&node.name, settings.clone()).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
