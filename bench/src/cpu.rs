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
    machine: MachineTicks,
    own_s: f64,
}

/// The CPU a drain spent, in seconds: see [`CpuClock`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuSpent {
    pub machine_s: f64,
    pub own_s: f64,
    /// Of `machine_s`, the kernel's: system, irq and softirq time.
    pub kernel_s: f64,
    /// Time the hypervisor ran something else while this VM had work.
    pub steal_s: f64,
    /// Context switches of every core.
    pub switches: f64,
    /// Page faults of every process (minor and major).
    pub faults: f64,
}

impl CpuClock {
    /// Now; `None` where /proc or the process's CPU clock says nothing
    /// (not Linux).
    pub fn now() -> Option<CpuClock> {
        Some(CpuClock { machine: MachineTicks::now()?, own_s: own_cpu_seconds()? })
    }

    pub fn spent(self) -> Option<CpuSpent> {
        let now = CpuClock::now()?;
        let (m, was) = (now.machine, self.machine);
        Some(CpuSpent {
            machine_s: m.busy_s - was.busy_s,
            own_s: now.own_s - self.own_s,
            kernel_s: m.kernel_s - was.kernel_s,
            steal_s: m.steal_s - was.steal_s,
            switches: m.switches - was.switches,
            faults: m.faults - was.faults,
        })
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
    /// Of `cpu_us_per_event`, the kernel's (system, irq, softirq).
    pub kernel_us_per_event: f64,
    /// The cores' time the hypervisor took while this VM had work, as a
    /// share like `busy_share`: what looks idle from inside and was not.
    pub steal_share: f64,
    /// Context switches of the whole machine per event.
    pub switches_per_event: f64,
    /// Page faults of the whole machine per event: a server backend maps
    /// each page of the shared buffers it touches on first touch, so a side
    /// with more fresh backends pays more of them.
    pub faults_per_event: f64,
}

impl MachineUse {
    /// From the CPU `spent` over `elapsed_s` of wall time draining `n` events.
    pub fn of(spent: Option<CpuSpent>, elapsed_s: f64, n: usize) -> Option<MachineUse> {
        let cores = std::thread::available_parallelism().ok()?.get() as f64;
        let spent = spent?;
        let per_event = |x: f64| x / n as f64;
        (elapsed_s > 0.0 && n > 0).then(|| MachineUse {
            cpu_us_per_event: per_event(spent.machine_s * 1e6),
            busy_share: spent.machine_s / (elapsed_s * cores),
            kernel_us_per_event: per_event(spent.kernel_s * 1e6),
            steal_share: spent.steal_s / (elapsed_s * cores),
            switches_per_event: per_event(spent.switches),
            faults_per_event: per_event(spent.faults),
        })
    }
}

/// The whole machine's counters so far, from /proc/stat: busy CPU seconds
/// of every core (user, nice, system, irq and softirq; idle, iowait and
/// steal left out; guest time is inside user), the kernel's part of them
/// (system, irq, softirq), the time stolen by the hypervisor, and context
/// switches (`ctxt`); and from /proc/vmstat, page faults (`pgfault`).
#[derive(Debug, Clone, Copy)]
struct MachineTicks {
    busy_s: f64,
    kernel_s: f64,
    steal_s: f64,
    switches: f64,
    faults: f64,
}

impl MachineTicks {
    fn now() -> Option<MachineTicks> {
        let vmstat = std::fs::read_to_string("/proc/vmstat").ok()?;
        MachineTicks::parse(&std::fs::read_to_string("/proc/stat").ok()?, &vmstat)
    }

    fn parse(stat: &str, vmstat: &str) -> Option<MachineTicks> {
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        let ticks: Vec<f64> = line.split_whitespace().map(|f| f.parse().ok()).collect::<Option<_>>()?;
        let sum = |fields: &[usize]| fields.iter().map(|&i| ticks.get(i).copied()).sum::<Option<f64>>();
        let switches = stat.lines().find_map(|l| l.strip_prefix("ctxt "))?.trim().parse().ok()?;
        Some(MachineTicks {
            busy_s: sum(&[0, 1, 2, 5, 6])? / USER_HZ,
            kernel_s: sum(&[2, 5, 6])? / USER_HZ,
            steal_s: sum(&[7])? / USER_HZ,
            switches,
            faults: vmstat.lines().find_map(|l| l.strip_prefix("pgfault "))?.trim().parse().ok()?,
        })
    }
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
    fn the_machine_counters_are_read_from_their_fields_of_proc_stat() {
        let stat = "cpu  100 5 40 900 7 3 2 11 0 0\ncpu0 50 2 20 450 3 1 1 5 0 0\nintr 1 2 3\nctxt 123456\nbtime 1\n";
        let vmstat = "pgpgin 5\npgfault 789\npgmajfault 2\n";
        let t = MachineTicks::parse(stat, vmstat).unwrap();
        assert_eq!(t.busy_s, 1.5, "user, nice, system, irq, softirq: 150 ticks");
        assert_eq!(t.kernel_s, 0.45, "system, irq, softirq: 45 ticks");
        assert_eq!(t.steal_s, 0.11);
        assert_eq!(t.switches, 123_456.0);
        assert_eq!(t.faults, 789.0);
        assert!(MachineTicks::parse("cpu  1 2 3\n", vmstat).is_none(), "no ctxt line");
        assert!(MachineTicks::parse(stat, "pgmajfault 2\n").is_none(), "no pgfault line");
        assert!(MachineTicks::now().is_some(), "this machine's /proc/stat");
    }

    #[test]
    fn a_machine_use_is_per_event_and_per_core() {
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        let spent =
            CpuSpent { machine_s: 1.0, own_s: 0.25, kernel_s: 0.5, steal_s: 0.1, switches: 3_000.0, faults: 500.0 };
        let used = MachineUse::of(Some(spent), 2.0, 1_000).unwrap();
        assert_eq!(used.cpu_us_per_event, 1_000.0);
        assert_eq!(used.busy_share, 1.0 / (2.0 * cores));
        assert_eq!(used.kernel_us_per_event, 500.0);
        assert_eq!(used.steal_share, 0.1 / (2.0 * cores));
        assert_eq!(used.switches_per_event, 3.0);
        assert_eq!(used.faults_per_event, 0.5);
        assert!(MachineUse::of(Some(spent), 0.0, 1_000).is_none(), "no time, no share");
        assert!(MachineUse::of(Some(spent), 2.0, 0).is_none(), "no events, no figure per event");
        assert!(MachineUse::of(None, 2.0, 1_000).is_none(), "nothing from /proc");
    }
}
