//! The local backend signals a node's whole process group: a node that is a
//! script dies, stops and resumes with every process it started, and a pause
//! returns once all of them have stopped.

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
        ready: None,
    };
    let backend = LocalBackend::new(PathBuf::from("/bin/sh"), dir.path().to_owned(), Vec::new(), vec![spec]);
    backend.start(&node).await.unwrap();
    let sleep = grandchild(&pidfile);
    // `$!` is known once the shell has forked, maybe before the child has
    // exec'd `sleep` and blocked in it: it may still be running (`R`).
    wait_for(sleep, "asleep", |s| s == Some('S'));

    // A pause is over once the node stands still, not when the signal is
    // sent: the shell and its child are stopped as it returns.
    backend.pause(&node).await.unwrap();
    assert_eq!(state(sleep), Some('T'), "the script's child after the pause");
    assert_eq!(state(backend.pid(&node).unwrap().as_raw() as u32), Some('T'), "the script after the pause");
    backend.resume(&node).await.unwrap();
    wait_for(sleep, "running again", |s| s == Some('S'));

    backend.kill(&node).await.unwrap();
    // Gone, or a zombie waiting for whoever adopted it.
    wait_for(sleep, "dead", |s| matches!(s, None | Some('Z')));
    assert!(!backend.is_running(&node));
}

/// A node given a readiness check serves only once it answers: a node that
/// opens its port half a second after it starts is waited for, and one that
/// exits before it ever answers is reported as gone, not waited on.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_serves_once_its_check_answers_and_not_after_it_exits() {
    use haunt_chaos::backends::ready::Ready;

    let dir = tempfile::tempdir().unwrap();
    let (port, _) = haunt_chaos::systems::brokers::free_ports().unwrap();
    let late = format!(
        "import socket, time; time.sleep(0.5); s = socket.socket(); \
         s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)"
    );
    let spec = |name: &str, program: &str, args: Vec<String>| NodeSpec {
        node: Node { name: name.into(), role: Role::Broker },
        args,
        program: Some(PathBuf::from(program)),
        env: Vec::new(),
        cwd: None,
        ready: Some((Ready::Tcp(port), Duration::from_secs(10))),
    };
    let specs = vec![
        spec("late", "python3", vec!["-c".into(), late]),
        spec("gone", "/bin/sh", vec!["-c".into(), "exit 3".into()]),
    ];
    let nodes: Vec<Node> = specs.iter().map(|s| s.node.clone()).collect();
    let backend = LocalBackend::new(PathBuf::from("/bin/sh"), dir.path().to_owned(), Vec::new(), specs);

    let started = Instant::now();
    backend.start(&nodes[0]).await.unwrap();
    backend.serves(&nodes[0]).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400), "served before its port opened");
    backend.kill(&nodes[0]).await.unwrap();

    // Its port is closed again; the second node never opens it.
    wait_for_closed(port);
    let started = Instant::now();
    backend.start(&nodes[1]).await.unwrap();
    let err = backend.serves(&nodes[1]).await.unwrap_err();
    assert!(format!("{err:#}").contains("exited"), "{err:#}");
    assert!(started.elapsed() < Duration::from_secs(5), "waited on a process that was gone");
}

fn wait_for_closed(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(Instant::now() < deadline, "port {port} still open");
        std::thread::sleep(Duration::from_millis(50));
    }
}
