//! The workers commit their leases and acks asynchronously on PostgreSQL
//! (`StoreOptions::async_lease_ack`): a crash of the database may undo
//! either, and all that may cost is a redelivery the inbox absorbs. These
//! tests crash a server of their own right after a lease or an ack, and
//! check what came back.
//!
//! An asynchronous commit reaches the WAL file when the WAL writer wakes
//! (every `wal_writer_delay`, 10 s at most), when a later commit flushes the
//! WAL behind it, or when the background writer writes a page it dirtied.
//! Slowing the WAL writer only narrows the window (it may wake between the
//! lease and the crash), so the tests stop (SIGSTOP) both writers while they
//! sleep and turn autovacuum off: nothing but a synchronous commit writes
//! the WAL until the crash, and the tests see the loss every time. With durable leases and acks the same steps lose
//! nothing, which shows the tests can tell.

use std::time::Duration;

use haunt_chaos::backends::postgres::PgServer;
use haunt_store::{Applied, Baseline, LeaseClock, Leased, OrderEvent, Store, StoreOptions};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::run::PrivatePostgres;

/// A private server whose WAL writer and background writer are stopped.
/// Fields drop in order: the writers go on before the server is stopped,
/// should a test fail before its crash.
struct Server {
    _asleep: Asleep,
    pg: PrivatePostgres,
    server: PgServer,
}

async fn server() -> Option<Server> {
    let pg = PrivatePostgres::start()?;
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&pg.url).await.unwrap();
    // One statement at a time: ALTER SYSTEM refuses to run in the implicit
    // transaction of a multi-statement string. No autovacuum: a vacuum
    // writing a page the lease dirtied would flush the WAL behind it.
    for statement in ["ALTER SYSTEM SET autovacuum = off", "SELECT pg_reload_conf()"] {
        sqlx::raw_sql(statement).execute(&mut conn).await.unwrap();
    }
    // The server can accept a connection before its postmaster has started
    // every auxiliary process (PostgreSQL starts the WAL writer from its
    // main loop once the server runs): in the suite's run of 2026-12-06, on
    // a loaded machine, this query found one writer of the two. Both come
    // within moments of the start.
    let mut writers: Vec<i32> = Vec::new();
    for _ in 0..200 {
        writers = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE backend_type IN ('walwriter', 'background writer')",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        if writers.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(writers.len(), 2, "the server's WAL writer and background writer, 10 s after its start: {writers:?}");
    drop(conn);
    let asleep = Asleep(writers.into_iter().map(|pid| stop_asleep(Pid::from_raw(pid))).collect());
    let server = PgServer::new(&pg.dir).unwrap();
    Some(Server { _asleep: asleep, pg, server })
}

/// Processes stopped while they slept, continued when dropped (a process
/// the crash killed ignores it).
struct Asleep(Vec<Pid>);

impl Drop for Asleep {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let _ = kill(pid, Signal::SIGCONT);
        }
    }
}

/// Stops `pid` inside its wait for events. A PostgreSQL process never waits
/// on its latch holding a lock, so stopped there it blocks nobody; stopped
/// anywhere else (in the middle of a write, holding the WAL's write lock)
/// it could hang the test, so it goes on and is stopped again a moment
/// later. `/proc/PID/syscall` of a stopped process names the system call it
/// is blocked in.
fn stop_asleep(pid: Pid) -> Pid {
    // epoll_wait, epoll_pwait and epoll_pwait2.
    let waits: &[&str] = match std::env::consts::ARCH {
        "x86_64" => &["232", "281", "441"],
        "aarch64" => &["22", "441"],
        arch => panic!("the system call numbers of epoll_wait on {arch} are not known here"),
    };
    for _ in 0..1000 {
        kill(pid, Signal::SIGSTOP).unwrap();
        // The stop takes effect asynchronously: wait for state T.
        for _ in 0..1000 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            if stat.rsplit(')').next().unwrap().split_whitespace().next() == Some("T") {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap();
        if waits.contains(&syscall.split_whitespace().next().unwrap_or("")) {
            return pid;
        }
        kill(pid, Signal::SIGCONT).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("process {pid} was never found waiting for events");
}

async fn open(url: &str, async_lease_ack: bool) -> Store {
    Store::connect(&url.parse().unwrap(), StoreOptions { async_lease_ack, ..StoreOptions::default() }).await.unwrap()
}

/// Ten orders of one item and their messages, as the API writes them.
async fn place(url: &str) {
    let baseline = Baseline::connect(&url.parse().unwrap(), 1).await.unwrap();
    baseline.enqueue(10, 1).await.unwrap();
    baseline.close().await;
}

/// Leases of 2 s: a message whose ack the crash undid is still leased when
/// the server is back, and deliverable again once the lease runs out.
const LEASE: Duration = Duration::from_secs(2);

async fn lease(store: &Store) -> Vec<Leased> {
    store.lease(100, LEASE, LeaseClock::Database).await.unwrap()
}

async fn apply(store: &Store, batch: &[Leased]) -> Vec<Applied> {
    let events: Vec<(&Leased, OrderEvent)> = batch.iter().map(|l| (l, l.event().unwrap())).collect();
    store.apply_batch(&events, "w").await.unwrap()
}

/// Crashes the server (SIGKILL to every process) and brings it back through
/// crash recovery.
async fn crash(server: &PgServer) {
    server.crash().unwrap();
    server.start().await.unwrap();
}

/// Applied, acked, then the crash: with asynchronous acks the messages are
/// back, delivered a second time, and the inbox takes each as a duplicate;
/// with durable acks nothing is back.
/// What came back after the crash, and what its second delivery did.
async fn an_ack_lost_to_a_crash(async_lease_ack: bool) -> Option<(usize, Vec<Applied>)> {
    let db = server().await?;
    let store = open(&db.pg.url, async_lease_ack).await;
    place(&db.pg.url).await;
    let batch = lease(&store).await;
    assert_eq!(batch.len(), 10);
    assert!(apply(&store, &batch).await.iter().all(|a| matches!(a, Applied::Applied { .. })));
    let ids: Vec<&str> = batch.iter().map(|l| l.message_id.as_str()).collect();
    assert_eq!(store.ack_batch(&ids, &batch[0].lease_token).await.unwrap(), 10);
    store.close().await;
    crash(&db.server).await;

    let store = open(&db.pg.url, async_lease_ack).await;
    let stats = store.queue_stats().await.unwrap();
    let back = (stats.visible + stats.leased) as usize;
    tokio::time::sleep(LEASE).await;
    let again = lease(&store).await;
    assert_eq!(again.len(), back, "what came back is delivered again once its lease ran out");
    let outcomes = apply(&store, &again).await;
    let ids: Vec<&str> = again.iter().map(|l| l.message_id.as_str()).collect();
    if !again.is_empty() {
        assert!(again.iter().all(|l| l.delivery_count == 2), "a second delivery: {again:?}");
        store.ack_batch(&ids, &again[0].lease_token).await.unwrap();
    }
    assert_eq!(store.projection().await.unwrap(), vec![("item-0".to_owned(), 10)], "each order counted once");
    store.close().await;
    Some((again.len(), outcomes))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_asynchronous_ack_lost_to_a_crash_is_a_redelivery_the_inbox_absorbs() {
    let Some((back, outcomes)) = an_ack_lost_to_a_crash(true).await else { return };
    assert_eq!(back, 10, "the crash undid the acks");
    assert!(outcomes.iter().all(|a| *a == Applied::Duplicate), "{outcomes:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_durable_ack_survives_the_same_crash() {
    let Some((back, _)) = an_ack_lost_to_a_crash(false).await else { return };
    assert_eq!(back, 0, "nothing acked came back");
}

/// Leased, then the crash: the lease is gone, and the worker that held it
/// (a zombie now) finds its apply fenced off; the next lease delivers the
/// messages again and applies them once.
#[tokio::test(flavor = "multi_thread")]
async fn an_asynchronous_lease_lost_to_a_crash_fences_off_its_holder() {
    let Some(db) = server().await else { return };
    let store = open(&db.pg.url, true).await;
    place(&db.pg.url).await;
    let held = lease(&store).await;
    assert_eq!(held.len(), 10);
    store.close().await;
    crash(&db.server).await;

    let store = open(&db.pg.url, true).await;
    let outcomes = apply(&store, &held).await;
    assert!(outcomes.iter().all(|a| *a == Applied::LeaseLost), "the lost lease holds nothing: {outcomes:?}");
    let again = lease(&store).await;
    assert_eq!(again.len(), 10, "deliverable again");
    assert!(apply(&store, &again).await.iter().all(|a| matches!(a, Applied::Applied { .. })));
    assert_eq!(store.projection().await.unwrap(), vec![("item-0".to_owned(), 10)]);
    store.close().await;
}
