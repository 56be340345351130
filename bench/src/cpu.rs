//! The benches' CPU clocks, read from /proc: [`cpu_seconds`] of one process
//! (a worker process, a server backend), and [`CpuClock`] of the whole machine
//! and this process around a drain whose consumers run in it.

/// Linux's clock ticks per second in /proc/stat and /proc/PID/stat (USER_HZ,
/// 100 on every architecture the kernel exports it for).
const USER_HZ: f64 = 100.0;

/// CPU time spent so far by the whole machine (every process, from
/// /proc/stat) and by this process: around a drain whose consumers run in
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
    /// Now; `None` where /proc says nothing (not Linux).
    pub fn now() -> Option<CpuClock> {
        Some(CpuClock { machine_s: machine_cpu_seconds()?, own_s: cpu_seconds(std::process::id())? })
    }

    pub fn spent(self) -> Option<CpuSpent> {
        let now = CpuClock::now()?;
        Some(CpuSpent { machine_s: now.machine_s - self.machine_s, own_s: now.own_s - self.own_s })
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

/// User plus system CPU seconds of a process, from /proc/PID/stat.
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
        // Spins until /proc has counted 50 ms of this process's CPU (five
        // ticks), within a wall-clock bound.
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
        assert!(cpu_seconds(std::process::id()).expect("/proc/self") >= spent.own_s - 0.01);
    }
}
