//! The local backend signals a node's whole process group: a node that is a
//! script dies, stops and resumes with every process it started.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use haunt_chaos::backends::local::{LocalBackend, NodeSpec};
use haunt_chaos::core::roles::{Backend, Node, Role};

/// The state letter of a process (`S`, `T`, `Z`, …), or `None` once it is gone.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next())
}

/// Waits up to 5 s for `pid`'s state to satisfy `ok`.
fn wait_for(pid: u32, what: &str, ok: impl Fn(Option<char>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ok(state(pid)) {
        assert!(Instant::now() < deadline, "process {pid} never became {what} (state {:?})", state(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn grandchild(pidfile: &Path) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(pid) = std::fs::read_to_string(pidfile).ok().and_then(|s| s.trim().parse().ok()) {
            return pid;
        }
        assert!(Instant::now() < deadline, "the script never wrote its child's pid");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_pause_and_resume_reach_what_a_node_started() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let node = Node { name: "script".into(), role: Role::Service };
    let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
    let spec = NodeSpec {
        node: node.clone(),
        args: vec!["-c".into(), script],
        program: Some(PathBuf::from("/bin/sh")),
        env: Vec::new(),
        cwd: None,
    };
    let backend = LocalBackend::new(PathBuf::from("/bin/sh"), dir.path().to_owned(), Vec::new(), vec![spec]);
    backend.start(&node).await.unwrap();
    let sleep = grandchild(&pidfile);
    // `$!` is known once the shell has forked, maybe before the child has
    // exec'd `sleep` and blocked in it: it may still be running (`R`).
    wait_for(sleep, "asleep", |s| s == Some('S'));

    backend.pause(&node).await.unwrap();
    wait_for(sleep, "stopped", |s| s == Some('T'));
    backend.resume(&node).await.unwrap();
    wait_for(sleep, "running again", |s| s == Some('S'));

    backend.kill(&node).await.unwrap();
    // Gone, or a zombie waiting for whoever adopted it.
    wait_for(sleep, "dead", |s| matches!(s, None | Some('Z')));
    assert!(!backend.is_running(&node));
}
