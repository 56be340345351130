//! Exponential backoff with jitter for failed deliveries.

use std::time::Duration;

/// `delay(n)` grows as `base · 2^(n-1)` up to `cap`, and half of it is jitter so
/// that messages failing together do not come back together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        // 100 ms lets a transient error (a lock timeout, a restarting database)
        // clear before the first retry; 30 s caps the wait of a message that
        // keeps failing well under any sane dead-letter horizon.
        Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The delay after the `attempt`-th failed delivery (from 1). `unit` is a
    /// random number in `[0, 1)` supplied by the caller, which keeps this pure.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        // 2^20 · base is far beyond any sane cap; the bound keeps the shift defined.
        let exp = attempt.saturating_sub(1).min(20);
        let full = self.base.saturating_mul(1 << exp).min(self.cap);
        let half = full / 2;
        half + half.mul_f64(unit.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_then_caps() {
        let b = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(1),
        };
        assert_eq!(b.delay(1, 1.0), Duration::from_millis(100));
        assert_eq!(b.delay(2, 1.0), Duration::from_millis(200));
        assert_eq!(b.delay(3, 1.0), Duration::from_millis(400));
        assert_eq!(b.delay(10, 1.0), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX, 1.0), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let b = Backoff::default();
        assert_eq!(b.delay(3, 0.0), Duration::from_millis(200));
        assert!(b.delay(3, 0.5) > Duration::from_millis(200));
        assert!(b.delay(3, 0.999) < Duration::from_millis(400));
    }
}
