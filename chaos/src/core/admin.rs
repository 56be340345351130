//! The client of the admin endpoints of a system's services (`docs/admin.md`):
//! the fault switches (`POST /admin/faults`) and the hold point (`POST
//! /admin/hold`). The system seam hands it to the nemeses that flip switches
//! and aim kills ([`crate::core::system::Switches`]).

use std::time::Duration;

use anyhow::Context;
use serde_json::json;

/// Flips services' fault switches through their admin endpoints
/// (`POST /admin/faults`).
#[derive(Debug, Clone)]
pub struct Admin {
    http: reqwest::Client,
    token: String,
    /// Node name and the base URL of its admin endpoint.
    pub workers: Vec<(String, String)>,
}

impl Admin {
    pub fn new(token: String, workers: Vec<(String, String)>) -> anyhow::Result<Self> {
        // Short: a worker that does not answer at once is paused or dead, and the
        // nemesis must not stall the schedule waiting for it.
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        Ok(Admin { http, token, workers })
    }

    fn base(&self, worker: &str) -> anyhow::Result<&str> {
        let (_, base) = self.workers.iter().find(|(n, _)| n == worker).context("unknown worker")?;
        Ok(base)
    }

    /// Whether `node` is one of these workers.
    pub fn has(&self, node: &str) -> bool {
        self.workers.iter().any(|(n, _)| n == node)
    }

    /// Asks `worker` to hold its next batch at its hold point (`POST
    /// /admin/hold`, see `haunt_worker::Faults::hold_next`) and waits for
    /// the worker's answer: `{"held": true, "point": …, "messages": …}`
    /// once a batch holds still there for `hold`, `{"held": false}` when none
    /// came within `wait`; an error when no answer came within `wait + margin`.
    pub async fn hold(
        &self,
        worker: &str,
        wait: Duration,
        margin: Duration,
        hold: Duration,
    ) -> anyhow::Result<serde_json::Value> {
        let base = self.base(worker)?;
        let body = json!({"wait_ms": wait.as_millis() as u64, "hold_ms": hold.as_millis() as u64});
        let r = self
            .http
            .post(format!("{base}/admin/hold"))
            .bearer_auth(&self.token)
            .json(&body)
            // The answer comes after up to `wait`: past the client's usual bound.
            .timeout(wait + margin)
            .send()
            .await
            .with_context(|| format!("asking {worker} to hold a batch"))?;
        anyhow::ensure!(r.status().is_success(), "{worker} refused the hold: {}", r.status());
        r.json().await.with_context(|| format!("{worker}'s answer to a hold"))
    }

    pub async fn set(&self, worker: &str, settings: serde_json::Value) -> anyhow::Result<()> {
        let base = self.base(worker)?;
        let r = self
            .http
            .post(format!("{base}/admin/faults"))
            .bearer_auth(&self.token)
            .json(&settings)
            .send()
            .await
            .with_context(|| format!("setting faults on {worker}"))?;
        anyhow::ensure!(r.status().is_success(), "{worker} refused the fault switch: {}", r.status());
        Ok(())
    }

    /// Sets `settings` on every worker; reports the first failure after trying all.
    pub async fn set_all(&self, settings: serde_json::Value) -> anyhow::Result<()> {
        let mut first_error = None;
        for (name, _) in &self.workers {
            if let Err(e) = self.set(name, settings.clone()).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
