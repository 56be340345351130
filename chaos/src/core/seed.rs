//! A run's one seed and every seed derived from it, in one place, so that a
//! replay with `--seed` draws the same workload and the same fault schedule,
//! and no two streams of choices share a seed by accident.

/// The 64-bit golden ratio: multiplied by a small index it spreads
/// neighbouring indices over the whole range (SplitMix64's increment).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// How far the schedule's seed is turned from the run's, so that it does not
/// equal client 0's (the run's seed itself).
const SCHEDULE_ROTATION: u32 = 17;

/// The seed a run prints and `--seed` replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSeed(pub u64);

impl RunSeed {
    /// A fresh seed, short enough to type back (48 bits).
    pub fn random() -> RunSeed {
        RunSeed(haunt_store::Rng::from_entropy().next_u64() >> 16)
    }

    /// The seed of the workload's client `thread`.
    pub fn client(self, thread: usize) -> u64 {
        self.0 ^ (thread as u64).wrapping_mul(GOLDEN_GAMMA)
    }

    /// The seed of the fault schedule.
    pub fn schedule(self) -> u64 {
        self.0.rotate_left(SCHEDULE_ROTATION)
    }
}

/// The seed of lane `lane` of a schedule seeded `schedule` (under
/// `--faults-at-once`, each lane draws its own faults; lane 0 is the
/// schedule's seed itself).
pub fn lane(schedule: u64, lane: usize) -> u64 {
    schedule.wrapping_add(lane as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derivations are part of what `--seed` replays: a run recorded
    /// before this module existed must draw the same choices after it.
    #[test]
    fn derivations_are_those_runs_were_recorded_with() {
        let seed = RunSeed(1);
        assert_eq!(seed.client(0), 1);
        assert_eq!(seed.client(3), 1 ^ 3u64.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        assert_eq!(seed.schedule(), 1 << 17);
        assert_eq!(lane(seed.schedule(), 2), (1 << 17) + 2);
        assert!(RunSeed::random().0 < 1 << 48);
    }
}
