//! Exponential backoff with jitter for failed deliveries, and the wait of a
//! loop whose database or broker keeps failing.

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
        Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(30) }
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

/// The wait of a loop after consecutive errors of its database or broker: the
/// loop's own poll interval after a success, doubling on each failure up to
/// [`ErrorWait::CAP`]. One for the worker's lease and consume loops and the
/// relay, so that all of them come back as soon after a fault heals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorWait {
    floor: Duration,
    now: Duration,
}

impl ErrorWait {
    /// A second: a local database or broker that restarts is back within a
    /// second or two, and a loop that waited 5 s (as these once did) missed
    /// most of a short run's faults after the first one; one attempt a second
    /// per loop costs a server that is down nothing.
    pub const CAP: Duration = Duration::from_secs(1);

    pub fn new(poll_interval: Duration) -> ErrorWait {
        let floor = poll_interval.min(ErrorWait::CAP);
        ErrorWait { floor, now: floor }
    }

    /// After an error: how long to wait before the next attempt.
    pub fn failed(&mut self) -> Duration {
        self.now = (self.now * 2).min(ErrorWait::CAP);
        self.now
    }

    /// After a success: the next error starts from the poll interval again.
    pub fn succeeded(&mut self) {
        self.now = self.floor;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_then_caps() {
        let b = Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(1) };
        assert_eq!(b.delay(1, 1.0), Duration::from_millis(100));
        assert_eq!(b.delay(2, 1.0), Duration::from_millis(200));
        assert_eq!(b.delay(3, 1.0), Duration::from_millis(400));
        assert_eq!(b.delay(10, 1.0), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX, 1.0), Duration::from_secs(1));
    }

    #[test]
    fn an_error_wait_doubles_to_its_cap_and_a_success_resets_it() {
        let mut w = ErrorWait::new(Duration::from_millis(100));
        assert_eq!(w.failed(), Duration::from_millis(200));
        assert_eq!(w.failed(), Duration::from_millis(400));
        assert_eq!(w.failed(), Duration::from_millis(800));
        assert_eq!(w.failed(), ErrorWait::CAP);
        assert_eq!(w.failed(), ErrorWait::CAP);
        w.succeeded();
        assert_eq!(w.failed(), Duration::from_millis(200));
        // A poll interval above the cap waits no longer than the cap.
        assert_eq!(ErrorWait::new(Duration::from_secs(3)).failed(), ErrorWait::CAP);
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let b = Backoff::default();
        assert_eq!(b.delay(3, 0.0), Duration::from_millis(200));
        assert!(b.delay(3, 0.5) > Duration::from_millis(200));
        assert!(b.delay(3, 0.999) < Duration::from_millis(400));
    }
}

/// A small, fast, seedable random source (SplitMix64). The harness needs
/// schedules that replay from a seed on any build; the services only need jitter.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// Seeded from the clock and the process: for jitter, not for replay.
    pub fn from_entropy() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng::new(nanos ^ (u64::from(std::process::id()) << 32))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[0, n)`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0) has no values");
        // The modulo bias is below 2^-40 for the small n used here.
        self.next_u64() % n
    }
}

#[cfg(test)]
mod rng_tests {
    use super::Rng;

    #[test]
    fn same_seed_same_sequence() {
        let a: Vec<u64> = (0..5).scan(Rng::new(42), |r, _| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..5).scan(Rng::new(42), |r, _| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
    }

    #[test]
    fn unit_is_in_range_and_spread() {
        let mut r = Rng::new(7);
        let xs: Vec<f64> = (0..10_000).map(|_| r.unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((0.45..0.55).contains(&mean), "{mean}");
    }
}

/// Database errors injected on purpose (the `db-error` fault): a statement that
/// fails inside a transaction, before its commit, as a lost connection or a
/// serialization failure would. Shared by every clone of a [`crate::Store`] and
/// switched at run time.
#[derive(Debug)]
pub struct InjectedErrors {
    /// `f64` bits: the chance that an injection point fails.
    rate: std::sync::atomic::AtomicU64,
    /// Advanced on every roll; hashed into a uniform number. Lock-free, since
    /// every order and every delivery rolls.
    rolls: std::sync::atomic::AtomicU64,
    /// Where this switch's sequence starts, drawn from entropy. One fixed
    /// sequence in every process and run made every worker of every seed
    /// meet the same stretch of its first rolls (12 failures in the first
    /// 80 at a rate of 0.3), so a short run saw few errors, in one pattern.
    start: u64,
}

impl Default for InjectedErrors {
    fn default() -> Self {
        // Two switches made in one clock tick still differ.
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut rng = Rng::from_entropy();
        InjectedErrors {
            rate: Default::default(),
            rolls: Default::default(),
            start: rng.next_u64() ^ Rng::new(made).next_u64(),
        }
    }
}

impl InjectedErrors {
    pub fn set_rate(&self, rate: f64) -> Result<(), String> {
        if !(0.0..=1.0).contains(&rate) {
            return Err(format!("db_error_rate must be within 0..=1, got {rate}"));
        }
        self.rate.store(rate.to_bits(), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    pub fn rate(&self) -> f64 {
        f64::from_bits(self.rate.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Whether this injection point fails now.
    pub fn roll(&self) -> bool {
        let rate = self.rate();
        if rate <= 0.0 {
            return false;
        }
        let n = self.rolls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The n-th value of a SplitMix64 stream seeded at `start`.
        Rng::new(self.start.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15))).unit() < rate
    }
}

#[cfg(test)]
mod injected_tests {
    use super::InjectedErrors;

    #[test]
    fn the_rate_is_honoured() {
        let e = InjectedErrors::default();
        assert!((0..1000).all(|_| !e.roll()));
        e.set_rate(1.0).unwrap();
        assert!((0..1000).all(|_| e.roll()));
        e.set_rate(0.3).unwrap();
        let hits = (0..10_000).filter(|_| e.roll()).count();
        assert!((2_500..3_500).contains(&hits), "{hits}");
        assert!(e.set_rate(-0.1).is_err());
        assert_eq!(e.rate(), 0.3, "a bad rate changes nothing");
    }

    /// Every switch starts its own sequence: the first rolls of fresh
    /// switches (each worker's first window) fail at the rate, and not all
    /// in one pattern.
    #[test]
    fn the_first_rolls_of_fresh_switches_fail_at_the_rate() {
        let patterns: Vec<Vec<bool>> = (0..50)
            .map(|_| {
                let e = InjectedErrors::default();
                e.set_rate(0.3).unwrap();
                (0..200).map(|_| e.roll()).collect()
            })
            .collect();
        let hits = patterns.iter().flatten().filter(|&&f| f).count();
        assert!((2_700..3_300).contains(&hits), "{hits} of 10,000");
        let mut distinct = patterns.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), patterns.len(), "each switch its own sequence");
    }
}
