//! Fault switches inside the worker, flipped by flag at start or at run time
//! through the admin endpoint.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use haunt_store::{InjectedErrors, Rng};
use serde::{Deserialize, Serialize};

/// Shared by the lease loops and the admin endpoint; atomics, since the loops
/// read them on every delivery and a lock would serialize them.
#[derive(Debug, Default)]
pub struct Faults {
    /// `f64` bits: the chance that an ack is dropped after the effect committed.
    ack_fail_rate: AtomicU64,
    /// Added to this worker's clock.
    clock_offset_ms: AtomicI64,
    /// Acks still to drop whatever the rate: an exact number of redeliveries,
    /// for the tutorial's scenario and its test.
    ack_fail_next: AtomicU64,
    /// The store's injected database errors (`db_error_rate`).
    db_errors: Arc<InjectedErrors>,
    /// Armed by the `stall` fault: the next lease that returns messages stalls
    /// this long before applying them (0: disarmed). One shot, so that one
    /// fault makes exactly one zombie.
    stall_after_lease_ms: AtomicU64,
    /// Armed by `POST /admin/hold`: the next batch to reach its hold point
    /// tells the waiting request, then holds still (see [`Faults::hold_next`]).
    hold: Mutex<Option<HoldArm>>,
    /// Whether `hold` is armed: read on every batch, without the lock.
    hold_armed: AtomicBool,
    /// Numbers the arms, so that a call ending clears its own arm only.
    hold_calls: AtomicU64,
}

/// Where a batch holds still for the nemesis: the moment a crash there costs
/// the most. With the ack sent after the apply, the effect has committed and
/// the ack is not sent, so a kill makes the queue deliver the batch again and
/// the inbox must absorb it. With the ack inside the apply's transaction, the
/// lease is in hand and nothing is written. With the ack sent on receipt (bug
/// mode `ack-before-process`, or a broker's at-most-once mode), the batch is
/// acked and not applied, so a kill loses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HoldPoint {
    BeforeAck,
    AfterLease,
    AckedNotApplied,
}

impl HoldPoint {
    /// Every point, by the name the admin endpoint gives it: a worker holds
    /// at one of them, which its configuration decides.
    pub const ALL: [&'static str; 3] = ["before-ack", "after-lease", "acked-not-applied"];
}

/// A batch at its hold point, as told to the request that armed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Held {
    pub point: HoldPoint,
    pub messages: usize,
}

#[derive(Debug)]
struct HoldArm {
    call: u64,
    /// Only a batch at this point holds (`None`: at whichever point the
    /// worker has).
    point: Option<HoldPoint>,
    reached: oneshot::Sender<Held>,
    hold: Duration,
}

/// Ends a [`Faults::hold_next`] however it ends (answered, timed out, its
/// request dropped): its arm, if still in the slot, is cleared, so that no
/// batch finds it later. One that a batch took is gone already; one a newer
/// call put there is that call's.
struct Disarm<'a> {
    faults: &'a Faults,
    call: u64,
}

impl Drop for Disarm<'_> {
    fn drop(&mut self) {
        let mut slot = self.faults.hold.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|arm| arm.call == self.call) {
            *slot = None;
            self.faults.hold_armed.store(false, Ordering::Release);
        }
    }
}

/// The longest a `POST /admin/hold` may wait for a batch, and the longest a
/// batch may hold still: the nemesis acts within moments of the answer, and a
/// hold it never acted on must not outlast a fault window.
pub const HOLD_MS_MAX: u64 = 30_000;

/// A rejected setting, naming its field (the admin endpoint's 422 body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultError {
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for FaultError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FaultError {}

/// The longest stall the `stall` fault may ask for. A stall stands for a GC
/// pause or a swapped-out process at the worst moment: seconds past a lease,
/// never long enough to outlast a run's drain.
pub const STALL_MS_MAX: u64 = 120_000;

fn rate(field: &'static str, value: Option<f64>) -> Result<(), FaultError> {
    match value {
        Some(r) if !(0.0..=1.0).contains(&r) => {
            Err(FaultError { field, message: format!("{field} must be within 0..=1, got {r}") })
        }
        _ => Ok(()),
    }
}

/// The switches as JSON (`GET`/`POST /admin/faults`); absent fields are left as they are.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_fail_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<i64>,
    /// The chance that a database statement fails before commit (held by the
    /// store; see `haunt_store::InjectedErrors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_error_rate: Option<f64>,
    /// Drop exactly the next N acks (on top of the rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_fail_next: Option<u64>,
    /// Stall the next lease that returns messages for this many ms before
    /// applying them (0 disarms): the worker becomes a zombie holding an
    /// expired lease when this is longer than the visibility timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_after_lease_ms: Option<u64>,
}

impl FaultSettings {
    /// Whether every value is in range; the error names the first that is not.
    pub fn check(&self) -> Result<(), FaultError> {
        rate("ack_fail_rate", self.ack_fail_rate)?;
        rate("db_error_rate", self.db_error_rate)?;
        if let Some(ms) = self.stall_after_lease_ms
            && ms > STALL_MS_MAX
        {
            return Err(FaultError {
                field: "stall_after_lease_ms",
                message: format!("stall_after_lease_ms must be at most {STALL_MS_MAX}, got {ms}"),
            });
        }
        Ok(())
    }
}

impl Faults {
    pub fn new(ack_fail_rate: f64, clock_offset_ms: i64) -> Result<Faults, FaultError> {
        let faults = Faults::default();
        faults.set(&FaultSettings {
            ack_fail_rate: Some(ack_fail_rate),
            clock_offset_ms: Some(clock_offset_ms),
            ..FaultSettings::default()
        })?;
        Ok(faults)
    }

    /// Switches `db_error_rate` on this store's injection points.
    pub fn with_db_errors(mut self, db_errors: Arc<InjectedErrors>) -> Faults {
        self.db_errors = db_errors;
        self
    }

    /// Applies `settings`, or changes nothing if any value is out of range.
    pub fn set(&self, settings: &FaultSettings) -> Result<(), FaultError> {
        settings.check()?;
        // Every value is checked: from here on nothing can fail halfway.
        if let Some(rate) = settings.db_error_rate {
            self.db_errors.set_rate(rate).map_err(|message| FaultError { field: "db_error_rate", message })?;
        }
        if let Some(ms) = settings.stall_after_lease_ms {
            self.stall_after_lease_ms.store(ms, Ordering::Relaxed);
        }
        if let Some(rate) = settings.ack_fail_rate {
            self.ack_fail_rate.store(rate.to_bits(), Ordering::Relaxed);
        }
        if let Some(offset) = settings.clock_offset_ms {
            self.clock_offset_ms.store(offset, Ordering::Relaxed);
        }
        if let Some(n) = settings.ack_fail_next {
            self.ack_fail_next.store(n, Ordering::Relaxed);
        }
        Ok(())
    }

    pub fn get(&self) -> FaultSettings {
        FaultSettings {
            ack_fail_rate: Some(f64::from_bits(self.ack_fail_rate.load(Ordering::Relaxed))),
            clock_offset_ms: Some(self.clock_offset_ms.load(Ordering::Relaxed)),
            ack_fail_next: Some(self.ack_fail_next.load(Ordering::Relaxed)),
            db_error_rate: Some(self.db_errors.rate()),
            stall_after_lease_ms: Some(self.stall_after_lease_ms.load(Ordering::Relaxed)),
        }
    }

    /// The stall armed for this lease, if any; disarms it.
    pub fn take_stall(&self) -> Option<Duration> {
        match self.stall_after_lease_ms.swap(0, Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Arms the hold point and waits up to `wait` for a batch to reach it;
    /// that batch then holds still for `hold`, so that
    /// whatever the caller does next (a SIGKILL, a SIGSTOP) finds it there.
    /// `None` when no batch came in time: the hold is disarmed, and a later
    /// batch goes through. So it is when the caller gives up (its request
    /// dropped). A second call while one waits replaces it.
    pub async fn hold_next(&self, point: Option<HoldPoint>, wait: Duration, hold: Duration) -> Option<Held> {
        let (reached, answer) = oneshot::channel();
        let call = self.hold_calls.fetch_add(1, Ordering::Relaxed);
        {
            let mut slot = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
            *slot = Some(HoldArm { call, point, reached, hold });
            self.hold_armed.store(true, Ordering::Release);
        }
        let _disarm = Disarm { faults: self, call };
        match tokio::time::timeout(wait, answer).await {
            Ok(Ok(held)) => Some(held),
            // Replaced by another call, or no batch in time.
            Ok(Err(_)) | Err(_) => None,
        }
    }

    /// A batch of `messages` at `point`: if a hold is armed and its caller
    /// still waits, tells it and holds still (a shutdown waits for it: the
    /// hold is bounded by [`HOLD_MS_MAX`], and the nemesis asks for a third
    /// of the lease at most, a second). Costs one atomic load otherwise.
    pub async fn at_hold_point(&self, point: HoldPoint, messages: usize) {
        if !self.hold_armed.load(Ordering::Acquire) {
            return;
        }
        let arm = {
            let mut slot = self.hold.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.as_ref().is_some_and(|arm| arm.point.is_some_and(|p| p != point)) {
                // Armed for another point: it stays armed for a batch there.
                return;
            }
            self.hold_armed.store(false, Ordering::Release);
            slot.take()
        };
        let Some(arm) = arm else { return };
        if arm.reached.send(Held { point, messages }).is_err() {
            return;
        }
        tracing::warn!(?point, messages, hold_ms = arm.hold.as_millis() as u64, "holding still for the nemesis");
        tokio::time::sleep(arm.hold).await;
    }

    /// Whether to drop this ack.
    pub fn drop_ack(&self, rng: &mut Rng) -> bool {
        let counted = self.ack_fail_next.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if counted.is_ok() {
            return true;
        }
        let rate = f64::from_bits(self.ack_fail_rate.load(Ordering::Relaxed));
        rate > 0.0 && rng.unit() < rate
    }

    /// This worker's idea of now, in ms since the epoch, offset by the skew fault.
    pub fn worker_now_ms(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        now + self.clock_offset_ms.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_out_of_range_rate_changes_nothing() {
        let f = Faults::new(0.25, 0).unwrap();
        let untouched = FaultSettings {
            ack_fail_rate: Some(0.25),
            clock_offset_ms: Some(0),
            ack_fail_next: Some(0),
            db_error_rate: Some(0.0),
            stall_after_lease_ms: Some(0),
        };
        let good = FaultSettings {
            ack_fail_rate: Some(0.5),
            clock_offset_ms: Some(9),
            ack_fail_next: Some(3),
            db_error_rate: Some(0.5),
            stall_after_lease_ms: Some(1000),
        };
        for (field, bad) in [
            ("ack_fail_rate", FaultSettings { ack_fail_rate: Some(1.5), ..good.clone() }),
            ("db_error_rate", FaultSettings { db_error_rate: Some(-0.1), ..good.clone() }),
            ("stall_after_lease_ms", FaultSettings { stall_after_lease_ms: Some(STALL_MS_MAX + 1), ..good.clone() }),
        ] {
            let e = f.set(&bad).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(field), "{e}");
            assert_eq!(f.get(), untouched, "a bad {field} changes nothing");
        }
    }

    #[test]
    fn a_stall_is_one_shot() {
        let f = Faults::new(0.0, 0).unwrap();
        assert_eq!(f.take_stall(), None);
        f.set(&FaultSettings { stall_after_lease_ms: Some(1500), ..FaultSettings::default() }).unwrap();
        assert_eq!(f.take_stall(), Some(Duration::from_millis(1500)));
        assert_eq!(f.take_stall(), None, "one stall per arming");
    }

    #[test]
    fn rates_zero_and_one_are_exact() {
        let mut rng = Rng::new(1);
        let never = Faults::new(0.0, 0).unwrap();
        let always = Faults::new(1.0, 0).unwrap();
        assert!((0..1000).all(|_| !never.drop_ack(&mut rng) && always.drop_ack(&mut rng)));
    }

    #[test]
    fn ack_fail_next_drops_exactly_that_many() {
        let mut rng = Rng::new(1);
        let f = Faults::new(0.0, 0).unwrap();
        f.set(&FaultSettings { ack_fail_next: Some(2), ..FaultSettings::default() }).unwrap();
        let dropped: Vec<bool> = (0..4).map(|_| f.drop_ack(&mut rng)).collect();
        assert_eq!(dropped, vec![true, true, false, false]);
    }
}
