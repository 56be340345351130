//! A `haunt worker` process draining a queue alone, measured from outside: its
//! rate, its peak resident set and CPU time, and the CPU time of its server
//! backends, all read from /proc. The one place the benches start a process.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use haunt_store::{Baseline, Store};
use serde_json::json;

use crate::cpu::{CpuClock, MachineUse, cpu_seconds};
use crate::pipeline::{DrainWatch, Timed, named};

/// How long a stopped worker process (or the profiler around it) may take to
/// exit: a profiler writes its data in seconds; past this it is killed.
const WORKER_EXIT_GRACE: Duration = Duration::from_secs(60);

/// The PostgreSQL application_name of the worker process's connections.
const WORKER_APPLICATION_NAME: &str = "haunt-bench-worker";

/// How long worker processes may take from their spawn to their first leases.
const WORKER_START_MAX: Duration = Duration::from_secs(30);

/// The longest process name /proc/PID/comm holds (TASK_COMM_LEN less its NUL).
const COMM_LEN_MAX: usize = 15;

/// How the worker process is started.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerCommand<'a> {
    /// The `haunt` executable.
    pub haunt: &'a Path,
    pub db: &'a haunt_store::DbUrl,
    /// Its RUST_LOG.
    pub rust_log: &'a str,
    /// Its --spans; `None` leaves the worker's default.
    pub spans: Option<&'a str>,
    pub batch_size: u32,
    /// Whether it serves its metrics (`--metrics-listen` on a port of its
    /// own), as every worker of `haunt run` does.
    pub metrics: bool,
    /// A command (split at spaces) the worker runs under, such as a profiler.
    pub wrapper: Option<&'a str>,
}

/// What a `haunt worker` process cost while it drained a queue alone.
#[derive(Debug, Default)]
pub(crate) struct WorkerProcess {
    pub events_per_s: f64,
    /// From its spawn to its first leases, outside the rate's time; `None`
    /// where the rate's time includes it (SQLite).
    pub start_s: Option<f64>,
    /// VmHWM, MiB.
    pub peak_rss_mib: Option<f64>,
    /// User and system CPU time of the worker process.
    pub cpu_s: Option<f64>,
    /// User and system CPU time of the server backends it connected to
    /// (PostgreSQL on this machine only).
    pub backends_cpu_s: Option<f64>,
}

impl WorkerProcess {
    /// The report's `worker_process` object, per event over `n` events.
    pub fn json(&self, n: usize, command: &WorkerCommand) -> serde_json::Value {
        json!({
            "events_per_s": self.events_per_s,
            "timed_from": timed_from(self.start_s),
            "start_s": self.start_s,
            "peak_rss_mib": self.peak_rss_mib,
            "rust_log": command.rust_log,
            "spans": command.spans.unwrap_or("the worker's default"),
            "metrics_served": command.metrics,
            "cpu_s": self.cpu_s,
            "cpu_us_per_event": self.cpu_s.map(|c| c * 1e6 / n as f64),
            "postgres_backends_cpu_s": self.backends_cpu_s,
            "postgres_backends_cpu_us_per_event": self.backends_cpu_s.map(|c| c * 1e6 / n as f64),
        })
    }
}

/// What a worker process's rate is timed from, for the report: its `first
/// lease` ([`start_held`]), or its `spawn` where nothing held the queue.
pub(crate) fn timed_from(start_s: Option<f64>) -> &'static str {
    match start_s {
        Some(_) => "first lease",
        None => "spawn",
    }
}

/// The process named `comm` at or below `pid`: the worker itself, or the child
/// of a profiler that started it (followed down at most 4 levels: a wrapper of
/// a wrapper is as deep as it goes).
fn process_named(pid: u32, comm: &str) -> Option<u32> {
    let mut pid = pid;
    for _ in 0..4 {
        if comm_is(pid, comm) {
            return Some(pid);
        }
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        pid = children.split_whitespace().next()?.parse().ok()?;
    }
    None
}

/// Whether process `pid` exists and /proc/PID/comm says `comm`.
fn comm_is(pid: u32, comm: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
}

/// Kills process `pid` if it is still the one named `comm` (not a pid the
/// kernel has given to another process since).
fn kill_if_named(pid: u32, comm: &str) {
    if let (true, Ok(pid)) = (comm_is(pid, comm), i32::try_from(pid)) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// What /proc/PID/comm says for a process started from `exe`: its file name,
/// cut to [`COMM_LEN_MAX`] bytes.
fn comm_of(exe: &Path) -> String {
    let name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut end = name.len().min(COMM_LEN_MAX);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

/// A `haunt worker` process (under `command.wrapper` if given) drains `n`
/// pre-enqueued events, timed from its first lease ([`start_held`]); its peak
/// resident set (VmHWM) and CPU times are read from /proc before it is stopped.
pub(crate) async fn worker_process(
    baseline: &Baseline,
    command: WorkerCommand<'_>,
    n: usize,
    watcher: &Store,
) -> anyhow::Result<WorkerProcess> {
    let wrapper = command.wrapper;
    let watch = DrainWatch::before(baseline, watcher, n).await?;
    let (mut children, start_s) = start_held(baseline, &command, 1).await?;
    let mut child = children.pop().context("no worker started")?;
    let started = Instant::now();
    let pid = child.id().context("the worker has no pid")?;
    watch
        .wait(started, || match child.try_wait()? {
            Some(status) => anyhow::bail!("the worker exited with {status} before draining"),
            None => Ok(()),
        })
        .await
        .with_context(|| format!("a worker process, {n} events"))?;
    let events_per_s = n as f64 / started.elapsed().as_secs_f64();
    let worker = process_named(pid, &comm_of(command.haunt));
    let peak_rss_mib = worker.and_then(|w| {
        let status = std::fs::read_to_string(format!("/proc/{w}/status")).ok()?;
        let kib: f64 =
            status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib / 1024.0)
    });
    let cpu_s = worker.and_then(cpu_seconds);
    let backends = baseline.backend_pids(WORKER_APPLICATION_NAME).await?;
    let backends_cpu_s = if backends.is_empty() {
        None
    } else {
        backends.iter().map(|&p| u32::try_from(p).ok().and_then(cpu_seconds)).sum::<Option<f64>>()
    };
    if wrapper.is_some() {
        // SIGINT, so that a profiler stops, writes its data and ends the worker.
        let _ = std::process::Command::new("kill").args(["-INT", &pid.to_string()]).status();
        if tokio::time::timeout(WORKER_EXIT_GRACE, child.wait()).await.is_err() {
            child.kill().await?;
        }
        // A wrapper that ends without ending the worker (`strace` detaches
        // on SIGINT and leaves its tracee running) leaves it to the bench.
        if let Some(w) = worker.filter(|&w| w != pid) {
            kill_if_named(w, &comm_of(command.haunt));
        }
    } else {
        child.kill().await?;
    }
    Ok(WorkerProcess { events_per_s, start_s, peak_rss_mib, cpu_s, backends_cpu_s })
}

/// Starts `count` worker processes with the queue held from their leases
/// ([`Baseline::hold_queue`]) and lets it go once every lease loop of every
/// process waits on it: the drain is then timed from its first lease, as the
/// in-process workers' and the limit's are, and not from the processes'
/// exec and connects (tens of milliseconds in a phase of about one second).
/// Answers the processes and how long that start took; `None` on SQLite,
/// where nothing holds the queue and the drain's clock starts at the spawn.
pub(crate) async fn start_held(
    baseline: &Baseline,
    command: &WorkerCommand<'_>,
    count: usize,
) -> anyhow::Result<(Vec<tokio::process::Child>, Option<f64>)> {
    let hold = baseline.hold_queue().await?;
    let spawned = Instant::now();
    let mut children =
        (1..=count).map(|i| spawn(command, &format!("bench-process-{i}"))).collect::<anyhow::Result<Vec<_>>>()?;
    let Some(hold) = hold else { return Ok((children, None)) };
    let loops = count * haunt_worker::WorkerConfig::default().concurrency;
    loop {
        let waiting = baseline.lock_waiters(WORKER_APPLICATION_NAME).await?;
        if waiting >= loops {
            break;
        }
        for child in &mut children {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("a worker exited with {status} before its first lease");
            }
        }
        anyhow::ensure!(
            spawned.elapsed() < WORKER_START_MAX,
            "{waiting} of the {loops} lease loops of {count} worker process(es) had sent their first lease {}s after \
             their start",
            WORKER_START_MAX.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let start_s = spawned.elapsed().as_secs_f64();
    hold.release().await?;
    Ok((children, Some(start_s)))
}

/// Starts a `haunt worker` process named `id` as `command` says.
fn spawn(command: &WorkerCommand<'_>, id: &str) -> anyhow::Result<tokio::process::Child> {
    let wrapper = command.wrapper;
    let mut words: Vec<String> = wrapper.map(|w| w.split_whitespace().map(String::from).collect()).unwrap_or_default();
    words.push(command.haunt.display().to_string());
    // Its connections are named, so that their server backends can be found.
    let url = named(command.db, WORKER_APPLICATION_NAME);
    tokio::process::Command::new(&words[0])
        .args(&words[1..])
        .args(["worker", "--db", url.as_str(), "--worker-id", id, "--poll-interval-ms", "5"])
        .args(["--batch-size-max", &command.batch_size.to_string()])
        .args(command.spans.map(|s| ["--spans", s]).into_iter().flatten())
        .args(if command.metrics { &["--metrics-listen", "127.0.0.1:0"][..] } else { &[] })
        .env("RUST_LOG", command.rust_log)
        .stdout(std::process::Stdio::null())
        // Its logs (a line per delivery at info with delivery spans) would drown the bench's.
        .stderr(if wrapper.is_some() { std::process::Stdio::inherit() } else { std::process::Stdio::null() })
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", words.join(" ")))
}

/// `count` `haunt worker` processes, as `haunt run` starts its workers, drain
/// `n` pre-enqueued events together, timed from their first lease
/// ([`start_held`]): their rate, what the drain cost the machine, and how
/// long they took to start.
pub(crate) async fn worker_processes(
    baseline: &Baseline,
    command: WorkerCommand<'_>,
    count: usize,
    n: usize,
    watcher: &Store,
) -> anyhow::Result<Timed> {
    let watch = DrainWatch::before(baseline, watcher, n).await?;
    let (mut children, start_s) = start_held(baseline, &command, count).await?;
    let (started, clock) = (Instant::now(), CpuClock::now());
    watch
        .wait(started, || {
            for child in &mut children {
                if let Some(status) = child.try_wait()? {
                    anyhow::bail!("a worker exited with {status} before draining");
                }
            }
            Ok(())
        })
        .await
        .with_context(|| format!("{count} worker processes, {n} events"))?;
    let elapsed = started.elapsed().as_secs_f64();
    let machine = MachineUse::of(clock.and_then(CpuClock::spent), elapsed, n);
    for child in &mut children {
        child.kill().await?;
    }
    Ok(Timed { events_per_s: n as f64 / elapsed, machine, start_s })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_comm_of_an_executable_is_its_name_cut_as_the_kernel_cuts_it() {
        assert_eq!(comm_of(Path::new("/work/target/debug/haunt")), "haunt");
        assert_eq!(comm_of(Path::new("/bin/a-very-long-executable-name")), "a-very-long-exe");
    }

    #[test]
    fn a_process_left_by_a_wrapper_is_killed_only_under_its_own_name() {
        let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().expect("sleep(1)");
        let pid = sleeper.id();
        // Until the child has exec'd, its comm is still the test's thread's:
        // a kill then would find another name and (rightly) do nothing.
        for _ in 0..1000 {
            if comm_is(pid, "sleep") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(comm_is(pid, "sleep"), "the child runs sleep within a second");
        kill_if_named(pid, "not-sleep");
        assert!(sleeper.try_wait().unwrap().is_none(), "a process of another name is left alone");
        kill_if_named(pid, "sleep");
        let status = sleeper.wait().unwrap();
        assert!(!status.success(), "killed: {status}");
    }
}
