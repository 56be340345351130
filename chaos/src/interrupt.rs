//! What a run does when it is interrupted, whoever started it: `haunt run`,
//! a `ChaosTest` in a `cargo test`, any caller of [`crate::assemble`].
//!
//! The first SIGINT or SIGTERM marks every run in progress in this process
//! aborted: each heals its faults, stops its processes and marks its run
//! directory, then returns. A second Ctrl-C kills at once, after removing
//! the containers (which, unlike child processes, carry no parent-death
//! signal) and starting again a database a run had crashed. A signal while
//! no run is in progress ends the process as the default action would, so a
//! test binary that has finished its chaos tests still stops on Ctrl-C.
//!
//! The handler is one per process, on a thread of its own, installed by the
//! first [`Guard`]: a run's flag is registered for as long as its guard
//! lives.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The exit status of a process a signal ended (128 + SIGINT), as shells report it.
pub const EXIT_INTERRUPTED: i32 = 130;

/// How soon after the first signal a second one counts as the user's: a
/// child of `haunt matrix` or `haunt guarantees` gets SIGINT from the kernel
/// when that parent dies, and again each time the signal is handed from one
/// exiting thread of the dead parent to another (strace showed two; a
/// loaded CI machine more), all within moments and some while the parent's
/// pid is still its parent's. Taken as a second Ctrl-C, they cut the heal
/// short and left the run unmarked.
const SECOND_SIGNAL_AFTER: Duration = Duration::from_secs(1);

/// The abort flags of the runs in progress.
static RUNS: Mutex<Vec<Arc<AtomicBool>>> = Mutex::new(Vec::new());
static HANDLER: OnceLock<()> = OnceLock::new();

/// A run's abort flag, set by the first signal; the run is in progress (for
/// the handler) while this lives.
#[derive(Debug)]
pub struct Guard {
    flag: Arc<AtomicBool>,
}

impl Guard {
    /// Registers a run, installing the process's handler on first use.
    pub fn new() -> Guard {
        HANDLER.get_or_init(install);
        let flag = Arc::new(AtomicBool::new(false));
        RUNS.lock().unwrap_or_else(|e| e.into_inner()).push(flag.clone());
        Guard { flag }
    }

    /// The flag the run's phases poll.
    pub fn flag(&self) -> &Arc<AtomicBool> {
        &self.flag
    }
}

impl Default for Guard {
    fn default() -> Guard {
        Guard::new()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        RUNS.lock().unwrap_or_else(|e| e.into_inner()).retain(|f| !Arc::ptr_eq(f, &self.flag));
    }
}

/// The handler's thread, with a runtime of its own so that it outlives any
/// caller's (each `#[tokio::test]` has one, dropped when the test ends).
fn install() {
    let spawned = std::thread::Builder::new().name("haunt-interrupt".into()).spawn(|| {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "haunt: no signal handler, Ctrl-C will not heal faults: {e}");
                return;
            }
        };
        runtime.block_on(handle());
    });
    if let Err(e) = spawned {
        let _ = writeln!(std::io::stderr(), "haunt: no signal handler, Ctrl-C will not heal faults: {e}");
    }
}

async fn handle() {
    let parent = std::os::unix::process::parent_id();
    let Ok(mut signals) = Signals::new() else {
        let _ =
            writeln!(std::io::stderr(), "haunt: installing the signal handlers failed; Ctrl-C will not heal faults");
        return;
    };
    signals.next().await;
    let runs: Vec<Arc<AtomicBool>> = RUNS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if runs.is_empty() {
        std::process::exit(EXIT_INTERRUPTED);
    }
    // Before a word is written: stderr may be a pipe whose reader is gone
    // (a `haunt matrix` that died), and a failed write must not stop the abort.
    for run in &runs {
        run.store(true, Ordering::Relaxed);
    }
    let _ =
        writeln!(std::io::stderr(), "interrupted: healing faults and stopping every process (again to kill at once)");
    let first = Instant::now();
    loop {
        signals.next().await;
        if RUNS.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            std::process::exit(EXIT_INTERRUPTED);
        }
        // Only a second Ctrl-C from whoever is still our parent, a
        // moment after the first (`SECOND_SIGNAL_AFTER`).
        if std::os::unix::process::parent_id() == parent && first.elapsed() >= SECOND_SIGNAL_AFTER {
            break;
        }
    }
    // Children die with us: they carry a parent-death signal. Containers
    // do not, so they go first, and a database the run crashed (not a
    // child either) starts again.
    crate::backends::docker::remove_live();
    crate::backends::postgres::restart_crashed();
    std::process::exit(EXIT_INTERRUPTED);
}

/// SIGINT and SIGTERM as one stream.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals { int: signal(SignalKind::interrupt())?, term: signal(SignalKind::terminate())? })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}
