//! The benches' CPU clocks: [`cpu_seconds`] of one process (a worker
//! process, a server backend) from /proc, and [`CpuClock`] of the whole
//! machine (/proc) and this process (its own CPU clock) around a drain whose
//! consumers run in it.

/// Linux's clock ticks per second in /proc/stat and /proc/PID/stat (USER_HZ,
/// 100 on every architecture the kernel exports it for).
const USER_HZ: f64 = 100.0;

/// CPU time spent so far by the whole machine (every process, from
/// /proc/stat, in ticks of 10 ms) and by this process (to the nanosecond):
/// around a drain whose consumers run in
/// this process against a server on this machine, the second is the
/// consumers' side and the difference the server's (and whatever else ran).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuClock {
    machine_s: f64,
    own_s: f64,
}

/// The CPU a drain spent, in seconds: see [`CpuClock`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuSpent {
    pub machine_s: f64,
    pub own_s: f64,
}

impl CpuClock {
    /// Now; `None` where /proc or the process's CPU clock says nothing
    /// (not Linux).
    pub fn now() -> Option<CpuClock> {
        Some(CpuClock { machine_s: machine_cpu_seconds()?, own_s: own_cpu_seconds()? })
    }

    pub fn spent(self) -> Option<CpuSpent> {
        let now = CpuClock::now()?;
        Some(CpuSpent { machine_s: now.machine_s - self.machine_s, own_s: now.own_s - self.own_s })
    }
}

/// What a drain of `n` events cost the whole machine: its CPU per event (every
/// process's, the server's and the consumers' together) and the share of
/// the cores busy meanwhile (1.0: every core busy all along). Measured on
/// both sides of a paired round, it says whether a side that drains slower
/// spent more CPU per event or left the cores idle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MachineUse {
    pub cpu_us_per_event: f64,
    pub busy_share: f64,
}

impl MachineUse {
    /// From the CPU `spent` over `elapsed_s` of wall time draining `n` events.
    pub fn of(spent: Option<CpuSpent>, elapsed_s: f64, n: usize) -> Option<MachineUse> {
        let cores = std::thread::available_parallelism().ok()?.get() as f64;
        let machine_s = spent?.machine_s;
        (elapsed_s > 0.0 && n > 0).then(|| MachineUse {
            cpu_us_per_event: machine_s * 1e6 / n as f64,
            busy_share: machine_s / (elapsed_s * cores),
        })
    }
}

/// Busy CPU seconds of every core so far, from /proc/stat's first line: user,
/// nice, system, irq and softirq (idle, iowait and steal left out; guest time
/// is inside user).
fn machine_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<f64> = line.split_whitespace().map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let busy = [0, 1, 2, 5, 6].iter().map(|&i| ticks.get(i).copied()).sum::<Option<f64>>()?;
    Some(busy / USER_HZ)
}

/// This process's CPU seconds, every thread's (those gone included), to the
/// nanosecond: a drain of a few hundred events spends less of it than
/// /proc's tick of 10 ms, and read in ticks it would often be none.
fn own_cpu_seconds() -> Option<f64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).ok()?;
    Some(t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
}

/// User plus system CPU seconds of a process, from /proc/PID/stat, in
/// ticks of 10 ms.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let (utime, stime): (f64, f64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    Some((utime + stime) / USER_HZ)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn the_clock_sees_this_process_spend_cpu_and_the_machine_with_it() {
        let clock = CpuClock::now().expect("/proc on Linux");
        let started = Instant::now();
        let mut x = 0u64;
        // Spins until this process's clock has counted 50 ms (five of
        // /proc's ticks), within a wall-clock bound.
        let spent = loop {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            let spent = clock.spent().expect("/proc on Linux");
            if spent.own_s >= 0.05 {
                break spent;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "no CPU counted for this process in 30 s: {spent:?}");
        };
        // The machine counted busy time while this process ran. (Not "at
        // least this process's": on a VM a tick the hypervisor stole from
        // counts as steal, which the busy time leaves out, while the
        // process's own clock is exact.)
        assert!(spent.machine_s > 0.0, "{spent:?}");
        // /proc's count of this process, in ticks, has seen some of it.
        let ticked = cpu_seconds(std::process::id()).expect("/proc/self");
        assert!(ticked > 0.0, "{ticked} s in /proc, {spent:?}");
    }

    /// What a drain of 300 events spends in the bench process is a few
    /// milliseconds: in /proc's ticks, often none (the pgmq pairing's median
    /// once read 0.0 µs an event). This process's own clock sees it.
    #[test]
    fn the_clock_sees_less_than_a_tick() {
        let clock = CpuClock::now().expect("/proc on Linux");
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(2) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        let spent = clock.spent().expect("/proc on Linux");
        assert!(spent.own_s > 0.0, "{spent:?}");
    }

    #[test]
    fn a_machine_use_is_per_event_and_per_core() {
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        let spent = CpuSpent { machine_s: 1.0, own_s: 0.25 };
        let used = MachineUse::of(Some(spent), 2.0, 1_000).unwrap();
        assert_eq!(used.cpu_us_per_event, 1_000.0);
        assert_eq!(used.busy_share, 1.0 / (2.0 * cores));
        assert!(MachineUse::of(Some(spent), 0.0, 1_000).is_none(), "no time, no share");
        assert!(MachineUse::of(Some(spent), 2.0, 0).is_none(), "no events, no figure per event");
        assert!(MachineUse::of(None, 2.0, 1_000).is_none(), "nothing from /proc");
    }
}
