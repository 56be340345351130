//! Faults that the services' own admin switches inject (`POST
//! /admin/faults`, `docs/admin.md`): lost acks, database errors, a skewed
//! clock, a stall right after a lease.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use super::{clear, peek, put};
use crate::core::admin::Admin;
use crate::core::fault::Fault;
use crate::core::roles::{BoxFuture, Nemesis};

/// Drops acks after the effect committed, on every worker.
#[derive(Debug)]
pub struct AckLossNemesis {
    admin: Admin,
    rate: f64,
    /// The rate the workers run with outside the fault's windows
    /// (`--ack-fail-rate`), which a stop restores.
    background: f64,
}

impl AckLossNemesis {
    pub fn new(admin: Admin, rate: f64, background: f64) -> Self {
        AckLossNemesis { admin, rate: rate.max(background), background }
    }
}

impl Nemesis for AckLossNemesis {
    fn name(&self) -> &'static str {
        Fault::AckLoss.name()
    }
    fn targets(&self) -> Vec<String> {
        vec!["workers".into()]
    }
    fn start<'a>(&'a self, _target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.admin.set_all(json!({"ack_fail_rate": self.rate})).await })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move { self.admin.set_all(json!({"ack_fail_rate": self.background})).await })
    }
}

/// Makes database statements fail before commit, in the API and the workers:
/// what a flaky connection or a serialization failure does. A correct pipeline
/// answers "not committed" or retries; a pipeline that splits what belongs in
/// one transaction is left half-done.
#[derive(Debug)]
pub struct DbErrorNemesis {
    admin: Admin,
    rate: f64,
}

impl DbErrorNemesis {
    pub fn new(admin: Admin, rate: f64) -> Self {
        DbErrorNemesis { admin, rate }
    }
}

impl Nemesis for DbErrorNemesis {
    fn name(&self) -> &'static str {
        Fault::DbError.name()
    }
    fn targets(&self) -> Vec<String> {
        vec!["services".into()]
    }
    fn start<'a>(&'a self, _target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.admin.set_all(json!({"db_error_rate": self.rate})).await })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move { self.admin.set_all(json!({"db_error_rate": 0.0})).await })
    }
}

/// Moves one worker's clock. A correct worker takes leases from the database
/// clock and does not notice.
#[derive(Debug)]
pub struct ClockSkewNemesis {
    switch: WorkerSwitch,
}

impl ClockSkewNemesis {
    pub fn new(admin: Admin, offset_ms: i64) -> Self {
        let switch = WorkerSwitch::new(admin, json!({"clock_offset_ms": offset_ms}), json!({"clock_offset_ms": 0}));
        ClockSkewNemesis { switch }
    }
}

/// An admin switch flipped on one worker at a time: on at the start, off at
/// the stop, and the worker forgotten only once the stop took effect (a stop
/// that failed is tried again on the same worker).
#[derive(Debug)]
struct WorkerSwitch {
    admin: Admin,
    on: serde_json::Value,
    off: serde_json::Value,
    target: Mutex<Option<String>>,
}

impl WorkerSwitch {
    fn new(admin: Admin, on: serde_json::Value, off: serde_json::Value) -> Self {
        WorkerSwitch { admin, on, off, target: Mutex::new(None) }
    }

    fn targets(&self) -> Vec<String> {
        self.admin.nodes.iter().map(|n| n.name.clone()).collect()
    }

    async fn start(&self, worker: &str) -> anyhow::Result<()> {
        put(&self.target, worker.to_owned());
        self.admin.set(worker, self.on.clone()).await
    }

    async fn stop(&self) -> anyhow::Result<()> {
        let Some(worker) = peek(&self.target) else { return Ok(()) };
        self.admin.set(&worker, self.off.clone()).await?;
        clear(&self.target);
        Ok(())
    }
}

impl Nemesis for ClockSkewNemesis {
    fn name(&self) -> &'static str {
        Fault::ClockSkew.name()
    }
    fn targets(&self) -> Vec<String> {
        self.switch.targets()
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(self.switch.start(target))
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.switch.stop())
    }
}

/// Stalls one worker right after its next lease that returns messages, for
/// twice the visibility timeout: a GC pause or a swapped-out process at the
/// worst moment. Unlike `pause`, which stops a process whatever it is doing,
/// the stall always leaves a zombie with a lease in hand: another worker takes
/// its messages over, and the zombie wakes up and carries on with them. A
/// correct worker's apply finds its lease gone and writes nothing.
#[derive(Debug)]
pub struct StallNemesis {
    visibility_timeout: Duration,
    /// Off disarms a stall that never met a lease; one under way runs out by
    /// itself (the window's hold covers it).
    switch: WorkerSwitch,
}

impl StallNemesis {
    pub fn new(admin: Admin, visibility_timeout: Duration) -> Self {
        // Twice the lease: another worker has time to take the messages over.
        let on = json!({"stall_after_lease_ms": (visibility_timeout * 2).as_millis() as u64});
        StallNemesis { visibility_timeout, switch: WorkerSwitch::new(admin, on, json!({"stall_after_lease_ms": 0})) }
    }
}

impl Nemesis for StallNemesis {
    fn name(&self) -> &'static str {
        Fault::Stall.name()
    }
    fn targets(&self) -> Vec<String> {
        self.switch.targets()
    }
    fn hold_min(&self) -> Duration {
        Fault::Stall.hold_min(self.visibility_timeout)
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(self.switch.start(target))
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.switch.stop())
    }
}
