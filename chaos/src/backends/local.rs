//! The local backend: the API and the workers as child processes of the
//! harness (the same `haunt` executable), faults by signals.
//!
//! No child may outlive the harness: each is started with a parent-death signal
//! (SIGKILL when the harness dies, however it dies), and dropping the backend
//! kills whatever is still running, which covers panics.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::ready::Ready;
use crate::core::roles::{Backend, BoxFuture, Node, Role};

/// How a node is started.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub node: Node,
    /// Arguments after the executable (`api --listen …`).
    pub args: Vec<String>,
    /// The executable, when it is not the backend's own (a foreign system's).
    pub program: Option<PathBuf>,
    /// Set on this node's process, after the backend's `env`.
    pub env: Vec<(String, String)>,
    /// Where the process starts (default: the harness's working directory).
    pub cwd: Option<PathBuf>,
    /// How to tell that it serves, and for how long to wait (see
    /// [`Backend::serves`]); none: as soon as the process runs.
    pub ready: Option<(Ready, Duration)>,
}

impl NodeSpec {
    /// A node run by the backend's executable with these arguments.
    pub fn args(node: Node, args: Vec<String>) -> NodeSpec {
        NodeSpec { node, args, program: None, env: Vec::new(), cwd: None, ready: None }
    }
}

#[derive(Debug)]
pub struct LocalBackend {
    exe: PathBuf,
    logs: PathBuf,
    env: Vec<(String, String)>,
    specs: Vec<NodeSpec>,
    children: Mutex<HashMap<String, Child>>,
}

/// How long a node gets to finish in-flight work after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

impl LocalBackend {
    /// `logs` is the folder for `<node>.log`; `env` is set on every child.
    pub fn new(exe: PathBuf, logs: PathBuf, env: Vec<(String, String)>, specs: Vec<NodeSpec>) -> LocalBackend {
        LocalBackend { exe, logs, env, specs, children: Mutex::new(HashMap::new()) }
    }

    fn spec(&self, node: &Node) -> anyhow::Result<&NodeSpec> {
        self.specs.iter().find(|s| s.node == *node).with_context(|| format!("no node {}", node.name))
    }

    /// The pid of the node's process, the leader of its process group, while
    /// the backend holds it.
    pub fn pid(&self, node: &Node) -> Option<Pid> {
        let children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        children.get(&node.name).map(|c| Pid::from_raw(c.id() as i32))
    }

    /// Signals the node's whole process group: a node that is a script
    /// (a broker's launcher, `sh -c …`) dies, stops and resumes with every
    /// process it started.
    fn signal(&self, node: &Node, signal: Signal) -> anyhow::Result<()> {
        let pid = self.pid(node).with_context(|| format!("{} is not running", node.name))?;
        killpg(pid, signal).with_context(|| format!("sending {signal} to {}", node.name))
    }

    /// Reaps a child that has exited, or waits for it up to `limit`.
    fn reap(&self, node: &Node, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        loop {
            {
                let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
                match children.get_mut(&node.name).map(|c| c.try_wait()) {
                    None => return true,
                    Some(Ok(Some(_))) | Some(Err(_)) => {
                        children.remove(&node.name);
                        return true;
                    }
                    Some(Ok(None)) => {}
                }
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills every child at once. Idempotent; used on drop.
    pub fn kill_all(&self) {
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        for (_, child) in children.iter_mut() {
            // The whole group: what the node started goes with it.
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        children.clear();
    }

    pub fn log_path(&self, node: &Node) -> PathBuf {
        self.logs.join(format!("{}.log", node.name))
    }
}

fn spawn(exe: &Path, spec: &NodeSpec, env: &[(String, String)], log: &Path) -> anyhow::Result<Child> {
    let out =
        OpenOptions::new().create(true).append(true).open(log).with_context(|| format!("opening {}", log.display()))?;
    let err = out.try_clone()?;
    let mut command = Command::new(exe);
    command.args(&spec.args).envs(env.iter().cloned()).stdin(Stdio::null()).stdout(out).stderr(err);
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    set_parent_death_signal(&mut command);
    command.spawn().with_context(|| format!("starting {} {}", exe.display(), spec.args.join(" ")))
}

/// How long a pause waits for its node's threads to stop: a stop takes a
/// scheduling of one of them, which a loaded machine may delay.
const STOP_WAIT_MAX: Duration = Duration::from_secs(10);

/// The threads of the processes in process group `pgid` that are neither
/// stopped nor exiting (from `/proc/*/stat` and `/proc/*/task/*/stat`).
fn running_threads(pgid: Pid) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let members = entries.flatten().filter(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { return false };
        // After the command's closing parenthesis: state, ppid, pgrp.
        stat_fields(&stat).and_then(|f| f.get(2).and_then(|g| g.parse::<i32>().ok())) == Some(pgid.as_raw())
    });
    members
        .filter_map(|e| std::fs::read_dir(e.path().join("task")).ok())
        .flat_map(|tasks| tasks.flatten())
        .filter(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            // A thread gone between the listing and the read is not running.
            let state = stat_fields(&stat).and_then(|f| f.first().copied());
            !matches!(state, None | Some("T" | "t" | "Z" | "X"))
        })
        .count()
}

/// The fields of a `/proc` stat line after the command's name, which is in
/// parentheses and may hold spaces and parentheses of its own.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat.rsplit_once(')')?.1.split_whitespace().collect())
}

/// Puts the child in a process group of its own, which the faults signal as
/// one, and asks the kernel to SIGKILL the child when the harness dies, even
/// by SIGKILL, where no destructor runs.
#[allow(unsafe_code)]
fn set_parent_death_signal(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // the async-signal-safe setpgid(2) and prctl(2) system calls.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0)).map_err(std::io::Error::from)?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            Ok(())
        });
    }
}

/// Asks the kernel to send the child SIGINT when this process dies, however
/// it dies: a child `haunt run` of `haunt matrix` or `haunt guarantees` then
/// heals its faults and stops its nodes as on Ctrl-C, instead of running on.
#[allow(unsafe_code)]
pub(crate) fn interrupt_when_parent_dies(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes the async-signal-safe prctl(2) system call.
    unsafe {
        command.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGINT).map_err(std::io::Error::from));
    }
}

impl Backend for LocalBackend {
    fn nodes(&self) -> Vec<Node> {
        self.specs.iter().map(|s| s.node.clone()).collect()
    }

    fn start<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            if self.is_running(node) {
                return Ok(());
            }
            let spec = self.spec(node)?;
            let env: Vec<_> = self.env.iter().chain(&spec.env).cloned().collect();
            let program = spec.program.as_ref().unwrap_or(&self.exe);
            let child = spawn(program, spec, &env, &self.log_path(node))?;
            self.children.lock().unwrap_or_else(|p| p.into_inner()).insert(node.name.clone(), child);
            Ok(())
        })
    }

    fn stop<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            if !self.is_running(node) {
                return Ok(());
            }
            // A paused process cannot act on SIGTERM.
            let _ = self.signal(node, Signal::SIGCONT);
            let _ = self.signal(node, Signal::SIGTERM);
            let node2 = node.clone();
            let done = tokio::task::block_in_place(|| self.reap(&node2, STOP_GRACE));
            if !done {
                tracing::warn!(node = %node.name, "did not stop within {STOP_GRACE:?}; killing it");
                self.kill(node).await?;
            }
            Ok(())
        })
    }

    fn serves<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let Some((ready, limit)) = &self.spec(node)?.ready else { return Ok(()) };
            ready
                .wait(*limit, || self.is_running(node))
                .await
                .map_err(|last| anyhow::anyhow!("{} does not serve again: {last}", node.name))
        })
    }

    fn kill<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            if !self.is_running(node) {
                return Ok(());
            }
            self.signal(node, Signal::SIGKILL)?;
            let node2 = node.clone();
            // SIGKILL cannot be ignored; the wait is for the kernel to tear down.
            tokio::task::block_in_place(|| self.reap(&node2, Duration::from_secs(5)));
            Ok(())
        })
    }

    /// Over once every thread of the node's processes has stopped. SIGSTOP
    /// stops a process only when one of its threads, woken for it, runs and
    /// stops the others; until then the rest run on. A JVM broker answered a
    /// request sent right after the signal, under a loaded suite (2026-12-06),
    /// so a pause that returned at the signal could start its window, or a
    /// test its check, before the node stood still.
    fn pause<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            self.signal(node, Signal::SIGSTOP)?;
            let pgid = self.pid(node).with_context(|| format!("{} is not running", node.name))?;
            let deadline = std::time::Instant::now() + STOP_WAIT_MAX;
            loop {
                let running = running_threads(pgid);
                if running == 0 {
                    return Ok(());
                }
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "{}: {running} threads still running {STOP_WAIT_MAX:?} after SIGSTOP",
                    node.name
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    }

    fn resume<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.signal(node, Signal::SIGCONT) })
    }

    fn resume_blocking(&self, node: &Node) -> anyhow::Result<()> {
        self.signal(node, Signal::SIGCONT)
    }

    fn teardown(&self, _logs: &Path) {
        // The children already write their logs there.
        self.kill_all();
    }

    fn is_running(&self, node: &Node) -> bool {
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        match children.get_mut(&node.name).map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                children.remove(&node.name);
                false
            }
            None => false,
        }
    }
}

impl Drop for LocalBackend {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The first worker, second worker, … as nodes.
pub fn worker_node(i: usize) -> Node {
    Node { name: format!("worker-{i}"), role: Role::Worker }
}

pub fn api_node() -> Node {
    Node { name: "api".into(), role: Role::Api }
}

/// The outbox relay of a broker transport.
pub fn relay_node() -> Node {
    Node { name: "relay".into(), role: Role::Relay }
}
