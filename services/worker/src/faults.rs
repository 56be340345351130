//! Fault switches inside the worker, flipped by flag at start or at run time
//! through the admin endpoint.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use std::sync::Arc;

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
}

impl Faults {
    pub fn new(ack_fail_rate: f64, clock_offset_ms: i64) -> Result<Faults, String> {
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
    pub fn set(&self, settings: &FaultSettings) -> Result<(), String> {
        if let Some(rate) = settings.ack_fail_rate
            && !(0.0..=1.0).contains(&rate)
        {
            return Err(format!("ack_fail_rate must be within 0..=1, got {rate}"));
        }
        if let Some(rate) = settings.db_error_rate {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("db_error_rate must be within 0..=1, got {rate}"));
            }
            self.db_errors.set_rate(rate)?;
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
        }
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
        let bad = FaultSettings {
            ack_fail_rate: Some(1.5),
            clock_offset_ms: Some(9),
            ack_fail_next: Some(3),
            db_error_rate: Some(0.5),
        };
        assert!(f.set(&bad).is_err());
        assert_eq!(
            f.get(),
            FaultSettings {
                ack_fail_rate: Some(0.25),
                clock_offset_ms: Some(0),
                ack_fail_next: Some(0),
                db_error_rate: Some(0.0)
            }
        );
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
