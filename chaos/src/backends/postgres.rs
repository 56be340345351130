//! A PostgreSQL server the harness may crash and restart: the `db-restart`
//! fault. It is found by its data directory: `postmaster.pid` names the process,
//! `postmaster.opts` the command line it was started with, so a restart brings
//! it back exactly as it was, through crash recovery.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::backends::docker::postgres_node;
use crate::core::roles::{Backend, BoxFuture, Node};

#[derive(Debug, Clone)]
pub struct PgServer {
    data_dir: PathBuf,
}

/// Splits `postmaster.opts`: the binary, then each argument in double quotes.
fn parse_opts(text: &str) -> anyhow::Result<(PathBuf, Vec<String>)> {
    let text = text.trim();
    let (binary, rest) = text.split_once(' ').unwrap_or((text, ""));
    let mut args = Vec::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let inner = rest.strip_prefix('"').context("postmaster.opts: expected a quoted argument")?;
        let end = inner.find('"').context("postmaster.opts: unterminated argument")?;
        args.push(inner[..end].to_owned());
        rest = inner[end + 1..].trim_start();
    }
    Ok((PathBuf::from(binary), args))
}

impl PgServer {
    pub fn new(data_dir: impl Into<PathBuf>) -> anyhow::Result<PgServer> {
        let data_dir = data_dir.into();
        anyhow::ensure!(
            data_dir.join("PG_VERSION").exists(),
            "{} is not a PostgreSQL data directory (no PG_VERSION)",
            data_dir.display()
        );
        Ok(PgServer { data_dir })
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    fn lock_pid(&self) -> Option<Pid> {
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        Some(Pid::from_raw(pid))
    }

    /// The lock file of the server's Unix socket, from `postmaster.pid`
    /// (its fourth line is the port, its fifth the first socket directory),
    /// when that file names a socket directory and a server that is not alive.
    fn socket_lock(&self) -> Option<PathBuf> {
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        socket_lock_of(&text)
    }

    /// The postmaster's pid, when it runs. A killed postmaster can linger as a
    /// zombie until its parent reaps it; a zombie is not running.
    pub fn pid(&self) -> Option<Pid> {
        self.lock_pid().filter(|&pid| alive(pid))
    }

    /// SIGKILL to every server process at once, as a machine crash would end
    /// them: no shutdown checkpoint, no last WAL write by a surviving backend.
    /// The next start recovers from the WAL, which is what durability must survive.
    pub fn crash(&self) -> anyhow::Result<()> {
        let pid = self.pid().context("PostgreSQL is not running")?;
        // Noted before the first signal: from here on the server may be down.
        let mut crashed = CRASHED.lock().unwrap_or_else(|p| p.into_inner());
        if !crashed.contains(&self.data_dir) {
            crashed.push(self.data_dir.clone());
        }
        drop(crashed);
        // Stop the postmaster first so it cannot fork replacements, then its children.
        kill(pid, Signal::SIGSTOP).context("stopping the postmaster")?;
        for child in children_of(pid) {
            let _ = kill(child, Signal::SIGKILL);
        }
        kill(pid, Signal::SIGKILL).context("killing the postmaster")?;
        self.kill_leftovers();
        // A process on its way out has already left its working directory,
        // which `kill_leftovers` looks for, while /proc still shows it alive.
        // Until it is gone, `start` would take the postmaster for a running
        // server and start nothing (seen under load: a start after the crash
        // returned at once, and no server came up).
        let deadline = std::time::Instant::now() + EXIT_WAIT_MAX;
        while alive(pid) {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the postmaster (pid {pid}) was still alive {EXIT_WAIT_MAX:?} after SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// SIGKILLs every process still working in the data directory (server
    /// processes run there). A backend forked while the postmaster was being
    /// stopped escapes the list of its children, and one that waits on a
    /// lightweight lock a killed process held never notices its postmaster
    /// died: it would keep the old shared memory busy, and no restart could
    /// succeed (seen: a backend in UPDATE, orphaned, for minutes). A crash
    /// kills them all, so this does too.
    fn kill_leftovers(&self) {
        // Each round kills what it finds; the rounds cover processes forked
        // by a postmaster already stopped (none can be) and exits slowed by a
        // loaded machine, for as long as a crashed postmaster may take to go.
        let Ok(dir) = std::fs::canonicalize(&self.data_dir) else { return };
        let deadline = std::time::Instant::now() + EXIT_WAIT_MAX;
        while std::time::Instant::now() < deadline {
            let left = working_in(&dir);
            if left.is_empty() {
                return;
            }
            for pid in left {
                let _ = kill(pid, Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the server with the options of its last start, as the owner of
    /// the data directory. Retries while the crashed server's backends are
    /// still exiting (the old shared memory is busy until they do).
    pub async fn start(&self) -> anyhow::Result<()> {
        let server = self.clone();
        tokio::task::spawn_blocking(move || server.start_blocking()).await?
    }

    /// [`PgServer::start`] on the calling thread: for `Drop` and a second
    /// Ctrl-C, where no runtime is left to wait on.
    pub fn start_blocking(&self) -> anyhow::Result<()> {
        if self.pid().is_some() {
            forget_crashed(&self.data_dir);
            return Ok(());
        }
        // Whatever of the crashed server is left holds its shared memory.
        self.kill_leftovers();
        if self.lock_pid().is_some() {
            // The lock files of a dead server: the postmaster would take a
            // zombie for a live owner and refuse to start. A crashed
            // postmaster stays a zombie until whoever adopted it reaps it
            // (about a second here), and its socket's lock file, in the
            // socket directory, blocked the first start after every crash.
            if let Some(lock) = self.socket_lock() {
                let _ = std::fs::remove_file(lock);
            }
            let _ = std::fs::remove_file(self.data_dir.join("postmaster.pid"));
        }
        let opts = std::fs::read_to_string(self.data_dir.join("postmaster.opts")).context("reading postmaster.opts")?;
        let (postgres, args) = parse_opts(&opts)?;
        let pg_ctl = postgres.with_file_name("pg_ctl");
        // Everything but the data directory, which pg_ctl passes itself.
        let mut options = Vec::new();
        let mut skip = false;
        for a in &args {
            if skip {
                skip = false;
            } else if a == "-D" {
                skip = true;
            } else {
                options.push(format!("'{}'", a.replace('\'', "")));
            }
        }
        let log = self.data_dir.join("server.log");
        let owner = std::fs::metadata(&self.data_dir)?.uid();
        // Ten tries over about ten seconds: backends notice the dead postmaster
        // within a second or two.
        const START_TRIES_MAX: u32 = 10;
        let mut last_error = String::new();
        for _ in 0..START_TRIES_MAX {
            let mut command = if nix::unistd::geteuid().is_root() && owner != 0 {
                let user = nix::unistd::User::from_uid(owner.into())?.context("the data directory's owner")?;
                let mut c = Command::new("runuser");
                c.args(["-u", &user.name, "--"]).arg(&pg_ctl);
                c
            } else {
                Command::new(&pg_ctl)
            };
            command
                .arg("-D")
                .arg(&self.data_dir)
                .arg("-l")
                .arg(&log)
                .args(["-w", "-t", "60", "start", "-o"])
                .arg(options.join(" "));
            let out = command.output().context("running pg_ctl")?;
            if out.status.success() {
                forget_crashed(&self.data_dir);
                return Ok(());
            }
            last_error = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            std::thread::sleep(Duration::from_secs(1));
        }
        anyhow::bail!("pg_ctl start failed: {last_error}")
    }
}

/// How long a crash waits for the server's processes to be gone: SIGKILL
/// ends a process at once, but a loaded machine may take a while to reap it.
const EXIT_WAIT_MAX: Duration = Duration::from_secs(10);

/// The data directories of servers this process crashed and has not started
/// again, for [`restart_crashed`].
static CRASHED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn forget_crashed(data_dir: &Path) {
    CRASHED.lock().unwrap_or_else(|p| p.into_inner()).retain(|d| d != data_dir);
}

/// Starts again every server this process crashed and has not restarted: for
/// a second Ctrl-C, which exits without unwinding, so no guard heals. A
/// database is not the harness's to leave down.
pub fn restart_crashed() {
    let dirs = CRASHED.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for dir in dirs {
        if let Err(e) = (PgServer { data_dir: dir.clone() }).start_blocking() {
            eprintln!("haunt: restarting PostgreSQL in {}: {e:#}", dir.display());
        }
    }
}

/// [`PgServer::socket_lock`] of the text of a `postmaster.pid`.
fn socket_lock_of(pid_file: &str) -> Option<PathBuf> {
    let mut lines = pid_file.lines();
    let pid: i32 = lines.next()?.trim().parse().ok()?;
    let port: u16 = lines.nth(2)?.trim().parse().ok()?;
    let dir = lines.next()?.trim();
    if dir.is_empty() || alive(Pid::from_raw(pid)) {
        return None;
    }
    Some(Path::new(dir).join(format!(".s.PGSQL.{port}.lock")))
}

/// Whether `pid` is a live process: present, and neither a zombie nor dead.
fn alive(pid: Pid) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z") | Some("X"))
}

/// The live PostgreSQL processes whose working directory is `dir` (from
/// `/proc/*/cwd` and `comm`; another user's processes are visible to root
/// only, as the harness runs when it crashes a server it does not own).
fn working_in(dir: &Path) -> Vec<Pid> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cwd = std::fs::read_link(e.path().join("cwd")).ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let postgres = comm.trim_end() == "postgres";
            (pid != me && postgres && cwd == dir && alive(Pid::from_raw(pid))).then(|| Pid::from_raw(pid))
        })
        .collect()
}

/// The processes whose parent is `parent` (from `/proc/*/stat`).
fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // The command name is in parentheses and may hold spaces: read after it.
            let ppid: i32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent.as_raw()).then(|| Pid::from_raw(pid))
        })
        .collect()
}

/// The server as the database node of a run (`postgres`, the same name as the
/// Docker backend's container): a kill crashes it, a start brings it back
/// through crash recovery, and a server the harness crashed is started again
/// however the run ends. The harness never stops or pauses it: it is the
/// user's server, not the run's.
impl Backend for PgServer {
    fn nodes(&self) -> Vec<Node> {
        vec![postgres_node()]
    }
    fn start<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(PgServer::start(self))
    }
    fn stop<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn kill<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.crash() })
    }
    fn pause<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { anyhow::bail!("{} is a server of its own: the harness does not pause it", node.name) })
    }
    fn resume<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn resume_blocking(&self, _: &Node) -> anyhow::Result<()> {
        Ok(())
    }
    /// Starts the server again if this process crashed it: a database the
    /// harness killed must not stay down because the harness panicked.
    fn restore_blocking(&self, _: &Node) {
        let crashed = CRASHED.lock().unwrap_or_else(|p| p.into_inner()).contains(&self.data_dir);
        if crashed && let Err(e) = self.start_blocking() {
            eprintln!("haunt: restarting PostgreSQL in {}: {e:#}", self.data_dir.display());
        }
    }
    fn is_running(&self, _: &Node) -> bool {
        self.pid().is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::{parse_opts, socket_lock_of};

    #[test]
    fn the_socket_lock_of_a_dead_server_is_named_from_its_pid_file() {
        // A pid no process has (above the kernel's pid_max).
        let dead = "4194305\n/tmp/data\n1796540024\n54400\n/tmp\n127.0.0.1\n  54400001   1\nready   \n";
        assert_eq!(socket_lock_of(dead), Some(PathBuf::from("/tmp/.s.PGSQL.54400.lock")));
        // A live one (this process) keeps its lock; no socket directory, no lock.
        let live = dead.replacen("4194305", &std::process::id().to_string(), 1);
        assert_eq!(socket_lock_of(&live), None);
        assert_eq!(socket_lock_of("4194305\n/tmp/data\n1796540024\n54400\n\n127.0.0.1\n"), None);
        assert_eq!(socket_lock_of("4194305\n/tmp/data\n"), None);
    }

    #[test]
    fn postmaster_opts_are_split_into_arguments() {
        let (bin, args) = parse_opts(
            "/usr/lib/postgresql/15/bin/postgres \"-D\" \"/tmp/pg\" \"-c\" \"listen_addresses=127.0.0.1\" \"-p\" \"54329\"\n",
        )
        .unwrap();
        assert_eq!(bin.to_str(), Some("/usr/lib/postgresql/15/bin/postgres"));
        assert_eq!(args, vec!["-D", "/tmp/pg", "-c", "listen_addresses=127.0.0.1", "-p", "54329"]);
        assert!(parse_opts("/bin/postgres -D x").is_err());
    }
}
