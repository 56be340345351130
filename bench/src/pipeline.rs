//! `haunt bench pipeline`: the worker and the API against what the database can
//! do, all measured in one run on one database.
//!
//! - the server-side limit, the figure the worker is measured against: haunt's
//!   own protocol on haunt's own tables run inside the database at haunt's
//!   batch size, three commits per batch (lease; inbox, projection and ledger;
//!   ack) as the worker commits, and the same with the ack in the effect's
//!   transaction (two commits). On PostgreSQL one `CALL` of a PL/pgSQL
//!   procedure per batch, with as many consumers as haunt's workers run lease
//!   loops, and also
//!   the three-commit protocol with the lease's and ack's commits
//!   asynchronous; on SQLite a prepared-statement loop on one native
//!   connection (one writer);
//! - the client-side SQL baseline (PostgreSQL only; the bench's "raw
//!   ceiling" until 2026-12-01, which it was not): the protocol as three
//!   hand-written statements sent by the client, the JSON parsed in SQL, at
//!   batch 100 and at haunt's batch size; and beside it a lock-based variant
//!   with one transaction per batch and no lease;
//! - the per-message design of the tutorial: lease one, apply it, ack it, three
//!   transactions per event (haunt's store with batches of one);
//! - haunt's workers draining the same pre-enqueued events, in this process
//!   (no tracing subscriber: their spans cost nothing here), with the ack
//!   after the apply's commit (the default, against the three-commit limit)
//!   and in the apply's transaction (`--ack-in-txn`, against the two-commit
//!   limit);
//! - a `haunt worker` process draining alone: its rate, peak memory and CPU
//!   time, and the CPU time of its server backends (`--worker-rust-log` sets
//!   its logging, so that the cost of spans and logs shows;
//!   `--profile-worker` runs it under a profiler and nothing else);
//! - API ingest over HTTP with C clients, against the raw two-statement insert
//!   transaction at the same concurrency;
//! - with `--pgmq-sql`, haunt's default drain paired with a consumer over
//!   pgmq written as pgmq's documentation shows one ([`crate::pgmq`]).
//!
//! The database must be empty; the bench empties the pipeline's tables between
//! phases and at the end.
//!
//! The baselines and the resets are SQL on the pipeline's tables, so they live
//! in the store ([`haunt_store::Baseline`]); this file only calls them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use haunt_store::{AckMode, Baseline, DbUrl, LeaseClock, Store, StoreOptions};
use haunt_telemetry::metrics::{OutcomeLabels, WorkerMetrics};
use serde_json::json;

use crate::PipelineOptions;
use crate::cpu::{CpuClock, CpuSpent, MachineUse, cpu_seconds};
use crate::pgmq::{AgainstPgmq, PgmqSql, pgmq_phase};
use crate::worker_process::{WorkerCommand, WorkerProcess, timed_from, worker_process, worker_processes};

/// Messages per batch of the client-side SQL baseline, as in issue 8's
/// pgbench script.
const CLIENT_SQL_BATCH: i64 = 100;

/// Events of the per-message phase at most: three commits per event make it
/// one to two orders of magnitude slower than the batched phases, and 2,000
/// events are seconds of it, enough for a steady rate.
const PER_MESSAGE_EVENTS_MAX: usize = 2_000;

/// The PostgreSQL application_name of the server-side limit's connections.
const LIMIT_APPLICATION_NAME: &str = "haunt-bench-limit";

/// The PostgreSQL application_name of the in-process workers' connections,
/// so that their backends can be told from the limit's and the bench's.
const WORKERS_APPLICATION_NAME: &str = "haunt-bench-workers";

/// What a drain's ledger carries besides each event applied once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// Issue 33's order record, as haunt's workers keep it: every ledger row
    /// numbered within its item from 1 to its projection row's count. haunt's
    /// drains, the server-side limits and the consumer over pgmq keep it.
    Numbered,
    /// No numbers: the client-side SQL baselines, hand-written before the
    /// record existed and shown for reference only.
    Plain,
}

/// Every event applied once, the queue empty, and (for a [`Record::Numbered`]
/// drain) every ledger row numbered: a phase that cheated would show.
pub(crate) async fn verify_drained(baseline: &Baseline, n: usize, phase: &str, record: Record) -> anyhow::Result<()> {
    let haunt_store::DrainCounts {
        queued,
        applied_events: applied,
        ledger_rows: rows,
        projection_total: total,
        numbered,
    } = baseline.drain_counts().await?;
    anyhow::ensure!(
        queued == 0 && applied == n as i64 && rows == n as i64 && total == n as i64,
        "{phase}: {queued} still queued, {applied} events applied in {rows} ledger rows, projection {total} (of {n})"
    );
    anyhow::ensure!(
        record == Record::Plain || numbered == rows,
        "{phase}: {numbered} of {rows} ledger rows numbered within their item (key_seq 1 to its applied_seq)"
    );
    Ok(())
}

/// The tutorial's design: lease one, apply it, ack it.
async fn per_message_drain(store: Store) -> anyhow::Result<()> {
    loop {
        let batch = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await?;
        let Some(leased) = batch.first() else { return Ok(()) };
        store.apply(leased, &leased.event()?, "per-message").await?;
        store.ack(&leased.message_id, &leased.lease_token).await?;
    }
}

/// One of the protocols the limit runs and haunt's workers run: three
/// commits a batch (lease; apply; ack) or two (the ack in the apply's
/// transaction), with every commit durable or the lease's and the ack's
/// asynchronous (PostgreSQL only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Protocol {
    name: &'static str,
    /// The JSON keys' suffix.
    key: &'static str,
    ack_in_apply: bool,
    async_lease_ack: bool,
}

impl Protocol {
    const THREE: Protocol =
        Protocol { name: "3 commits", key: "3_commits", ack_in_apply: false, async_lease_ack: false };
    const THREE_ASYNC: Protocol = Protocol {
        name: "3 commits, lease+ack async",
        key: "3_commits_async_lease_ack",
        ack_in_apply: false,
        async_lease_ack: true,
    };
    const TWO: Protocol = Protocol { name: "2 commits", key: "2_commits", ack_in_apply: true, async_lease_ack: false };
    const TWO_ASYNC: Protocol = Protocol {
        name: "2 commits, lease async",
        key: "2_commits_async_lease",
        ack_in_apply: true,
        async_lease_ack: true,
    };
    const ALL: [Protocol; 4] = [Protocol::THREE, Protocol::THREE_ASYNC, Protocol::TWO, Protocol::TWO_ASYNC];

    /// What haunt's workers run by default (`ack_in_apply`: with `--ack-in-txn`).
    fn default_for(postgres: bool, ack_in_apply: bool) -> Protocol {
        match (postgres, ack_in_apply) {
            (true, false) => Protocol::THREE_ASYNC,
            (true, true) => Protocol::TWO_ASYNC,
            (false, false) => Protocol::THREE,
            (false, true) => Protocol::TWO,
        }
    }

    fn key(&self, prefix: &str) -> String {
        format!("{prefix}_{}", self.key)
    }
}

/// How haunt's workers drain in a phase.
#[derive(Debug, Clone, Copy)]
struct Drain {
    batch_size: u32,
    protocol: Protocol,
}

/// A drain's rate, the CPU it spent where /proc says (see [`CpuClock`]), and
/// the WAL the server wrote meanwhile (PostgreSQL).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drained {
    pub events_per_s: f64,
    pub cpu: Option<CpuSpent>,
    pub wal_bytes: Option<i64>,
}

/// The WAL written since `start` (a [`Baseline::wal_position`]), if both
/// readings were had.
pub(crate) async fn wal_since(baseline: &Baseline, start: Option<i64>) -> Option<i64> {
    Some(baseline.wal_position().await? - start?)
}

/// One drain of the queue by `workers` in-process workers under `how`: its
/// rate, its CPU and, given `wal` (the bench's own connections, outside the
/// drain's pools), the WAL the server wrote meanwhile.
async fn haunt_drain(
    db: &DbUrl,
    workers: usize,
    how: Drain,
    n: usize,
    wal: Option<&Baseline>,
) -> anyhow::Result<Drained> {
    // The pools are opened, migrated and warmed before the clock starts, as
    // the server-side limit's pool is: the figure is the drain, not the
    // connects (which took a few percent of a 1 s phase when they were timed).
    let config = haunt_worker::WorkerConfig::default();
    let options = StoreOptions { async_lease_ack: how.protocol.async_lease_ack, ..StoreOptions::default() };
    let mut stores = Vec::new();
    let named_db = named(db, WORKERS_APPLICATION_NAME);
    for _ in 0..workers {
        let store = Store::connect(&named_db, options.clone()).await?;
        // As `haunt worker` does before its first lease.
        store.warm_loops(config.concurrency as u32).await?;
        stores.push(store);
    }
    let watcher = Store::connect(db, StoreOptions::default()).await?;
    let wal_start = match wal {
        Some(baseline) => baseline.wal_position().await,
        None => None,
    };
    let ack = if how.protocol.ack_in_apply { AckMode::InApplyTxn } else { AckMode::Separate };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut running = tokio::task::JoinSet::new();
    let mut metrics = Vec::new();
    let (started, cpu) = (Instant::now(), CpuClock::now());
    for (w, store) in stores.into_iter().enumerate() {
        let config = haunt_worker::WorkerConfig {
            worker_id: format!("bench-{w}"),
            batch_size_max: how.batch_size,
            ack,
            poll_interval: Duration::from_millis(5),
            ..config.clone()
        };
        let m = Arc::new(WorkerMetrics::default());
        metrics.push(m.clone());
        let worker = haunt_worker::Worker::new(store, config, Arc::default(), m);
        let stopped = stopped.clone();
        running.spawn(async move { worker.run(stopped).await });
    }
    // The workers' own count of applications, read from memory every
    // millisecond, says when the last event is in; then the queue is polled
    // (a probe that stops at its first row) until the last ack is in too.
    // Polling the database all along cost the drain a good part of a core
    // (a count of every row, 50 times a second) that the limit did not pay.
    let applied = || -> u64 {
        metrics.iter().map(|m| m.deliveries.get_or_create(&OutcomeLabels { outcome: "applied" }).get().0).sum()
    };
    while applied() < n as u64 {
        anyhow::ensure!(!running.is_empty() && started.elapsed() < Duration::from_secs(600), "not drained in 600 s");
        if let Some(ended) = running.try_join_next() {
            ended.context("a worker panicked")?;
            anyhow::bail!("a worker stopped before the drain ended");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    while !watcher.queue_is_empty().await? {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "not drained in 600 s");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (elapsed, cpu) = (started.elapsed().as_secs_f64(), cpu.and_then(CpuClock::spent));
    let wal_bytes = match wal {
        Some(baseline) => wal_since(baseline, wal_start).await,
        None => None,
    };
    let _ = stop.send(true);
    while let Some(ended) = running.join_next().await {
        ended.context("joining a worker")?;
    }
    watcher.close().await;
    Ok(Drained { events_per_s: n as f64 / elapsed, cpu, wal_bytes })
}

/// [`haunt_drain`]'s rate alone.
async fn haunt_rate(db: &DbUrl, workers: usize, how: Drain, n: usize) -> anyhow::Result<f64> {
    Ok(haunt_drain(db, workers, how, n, None).await?.events_per_s)
}

/// [`haunt_drain`]'s rate and what it cost the machine.
async fn haunt_rate_and_use(db: &DbUrl, workers: usize, how: Drain, n: usize) -> anyhow::Result<Timed> {
    let d = haunt_drain(db, workers, how, n, None).await?;
    let machine = MachineUse::of(d.cpu, n as f64 / d.events_per_s, n);
    Ok(Timed { events_per_s: d.events_per_s, machine, start_s: None })
}

/// One timed drain of haunt's in the paired rounds: its rate, what it cost the
/// machine, and for worker processes how long they took to start, outside
/// the rate's time (`None` for in-process workers, whose pools are opened
/// before the clock starts, and on SQLite, where a process's start is inside).
pub(crate) struct Timed {
    pub events_per_s: f64,
    pub machine: Option<MachineUse>,
    pub start_s: Option<f64>,
}

/// One drain phase: `n` events enqueued, the tables settled
/// ([`Baseline::settle`]), `measure` run, every event checked applied once
/// and numbered ([`Record::Numbered`]), the tables emptied for the next phase.
async fn drain_phase<T, Fut>(
    baseline: &Baseline,
    size: (usize, usize),
    phase: &str,
    measure: impl FnOnce() -> Fut,
) -> anyhow::Result<T>
where
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    drain_phase_keeping(baseline, size, (phase, Record::Numbered), measure).await
}

/// [`drain_phase`] of a drain whose ledger keeps `record`.
async fn drain_phase_keeping<T, Fut>(
    baseline: &Baseline,
    (n, items): (usize, usize),
    (phase, record): (&str, Record),
    measure: impl FnOnce() -> Fut,
) -> anyhow::Result<T>
where
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    baseline.enqueue(n, items).await?;
    if !baseline.settle().await? {
        eprintln!("warning: {phase}: no checkpoint before it (CHECKPOINT needs a superuser or pg_checkpoint)");
    }
    let value = measure().await?;
    verify_drained(baseline, n, phase, record).await?;
    baseline.reset().await?;
    Ok(value)
}

/// Refuses a database that holds anything: the benches empty their tables
/// after each phase. `store` has opened (and so migrated) it.
pub(crate) async fn ensure_empty(store: &Store, db: &DbUrl) -> anyhow::Result<()> {
    anyhow::ensure!(store.is_empty().await?, "{db} is not empty; the bench needs a database of its own");
    Ok(())
}

/// How far `haunt worker` processes have drained, seen from outside them:
/// the bench cannot read their count of applications, as it reads the
/// in-process workers'.
pub(crate) struct DrainWatch<'a> {
    baseline: &'a Baseline,
    watcher: &'a Store,
    /// The ledger's rows numbered before the drain.
    ledger_from: i64,
    n: usize,
}

impl<'a> DrainWatch<'a> {
    /// Read before the drain's first lease, for a drain of `n` events.
    pub(crate) async fn before(baseline: &'a Baseline, watcher: &'a Store, n: usize) -> anyhow::Result<Self> {
        let ledger_from = baseline.ledger_numbered().await?;
        Ok(DrainWatch { baseline, watcher, ledger_from, n })
    }

    /// Returns once the queue is empty (every event applied and acked: the
    /// phase's drain is verified after). Until the ledger's numbering says that
    /// about `n` events are in, it is read at the intervals [`next_read`]
    /// gives: a few reads a drain, closer together as its end nears, never
    /// more than one every 2 ms; then the queue every millisecond until the
    /// last ack is in too. Probing the queue all along cost the processes'
    /// drain what the limit's never paid: its head is where the acks leave
    /// their dead rows, and 100 probes a second took a fifth of a core (2.7
    /// ms each by a scan of the table; 0.5 ms by its index). Reading the
    /// numbering every 2 ms cost less, but still woke the bench and a
    /// backend 500 times a second on cores the drain had to share. `alive`
    /// fails the wait early when the consumers died.
    pub(crate) async fn wait(
        &self,
        started: Instant,
        mut alive: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let n = self.n as i64;
        let mut last = (Duration::ZERO, 0);
        loop {
            let (at, done) = (started.elapsed(), self.baseline.ledger_numbered().await? - self.ledger_from);
            if done >= n {
                break;
            }
            alive()?;
            anyhow::ensure!(at < Duration::from_secs(600), "not drained in 600 s");
            tokio::time::sleep(next_read(last, (at, done), n)).await;
            last = (at, done);
        }
        while !self.watcher.queue_is_empty().await? {
            alive()?;
            anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "not drained in 600 s");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
}

/// The shortest wait between two reads of a drain's progress.
const READ_EVERY_MIN: Duration = Duration::from_millis(2);
/// The longest.
const READ_EVERY_MAX: Duration = Duration::from_millis(100);

/// How long a watcher waits before it reads a drain's progress again, having
/// read `done` of `n` events in at `at` (both since the drain's start) and
/// `last` the read before: two fifths of the time the rest would take at the
/// faster of the rate so far and the rate since the read before, within
/// [`READ_EVERY_MIN`] and [`READ_EVERY_MAX`]. A drain would have to speed up
/// two and a half times from one read to the next for a wait to pass its
/// end; where nothing is in yet, the shortest wait.
pub(crate) fn next_read(last: (Duration, i64), (at, done): (Duration, i64), n: i64) -> Duration {
    let rate = |from: (Duration, i64)| {
        let dt = at.saturating_sub(from.0).as_secs_f64();
        if dt > 0.0 { (done - from.1) as f64 / dt } else { 0.0 }
    };
    let fastest = rate((Duration::ZERO, 0)).max(rate(last));
    if fastest <= 0.0 {
        return READ_EVERY_MIN;
    }
    let rest = Duration::from_secs_f64((n - done).max(0) as f64 / fastest);
    rest.mul_f64(0.4).clamp(READ_EVERY_MIN, READ_EVERY_MAX)
}

/// Runs `tasks` copies of `f` side by side and returns the events per second.
pub(crate) async fn timed<F, Fut>(n: usize, tasks: usize, f: F) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        set.spawn(f(t));
    }
    while let Some(r) = set.join_next().await {
        r.context("a bench task panicked")??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

async fn http_ingest(
    http: reqwest::Client,
    url: String,
    client: usize,
    clients: usize,
    n: usize,
) -> anyhow::Result<()> {
    for i in (client..n).step_by(clients) {
        let body = json!({"order_id": format!("h-{i}"), "item_id": "item-0", "qty": 1});
        let r = http.post(&url).json(&body).send().await?;
        anyhow::ensure!(r.status() == reqwest::StatusCode::CREATED, "POST /orders answered {}", r.status());
    }
    Ok(())
}

/// `url` with its PostgreSQL connections named `name` (SQLite's unchanged).
pub(crate) fn named(db: &DbUrl, name: &str) -> DbUrl {
    if !db.is_postgres() {
        return db.clone();
    }
    let url = db.as_str();
    let named = format!("{url}{}application_name={name}", if url.contains('?') { '&' } else { '?' });
    DbUrl::parse(&named).expect("a parameter added to a PostgreSQL URL keeps its scheme")
}

/// CPU seconds so far of each server backend named `name` (PostgreSQL on this
/// machine; empty otherwise).
async fn backends_cpu(baseline: &Baseline, name: &str) -> anyhow::Result<std::collections::HashMap<i64, f64>> {
    let pids = baseline.backend_pids(name).await?;
    Ok(pids.into_iter().filter_map(|p| Some((p, cpu_seconds(u32::try_from(p).ok()?)?))).collect())
}

/// A server-side limit's rate, and the CPU its backends spent, in µs per event.
#[derive(Debug, Clone, Copy)]
struct Limit {
    events_per_s: f64,
    backends_cpu_us_per_event: Option<f64>,
    machine: Option<MachineUse>,
}

/// `tasks` consumers of the server-side limit drain the queue over `limit`'s
/// pool, whose backends are named [`LIMIT_APPLICATION_NAME`].
async fn server_side_at(
    (baseline, limit): (&Baseline, &Baseline),
    n: usize,
    tasks: usize,
    batch: i64,
    (ack_in_effect, async_lease_ack): (bool, bool),
) -> anyhow::Result<Limit> {
    let before = backends_cpu(baseline, LIMIT_APPLICATION_NAME).await?;
    let b = limit.clone();
    let (started, clock) = (Instant::now(), CpuClock::now());
    let events_per_s = timed(n, tasks, move |t| {
        let b = b.clone();
        async move {
            b.server_side_drain(t, batch, ack_in_effect, async_lease_ack).await?;
            Ok(())
        }
    })
    .await?;
    let machine = MachineUse::of(clock.and_then(CpuClock::spent), started.elapsed().as_secs_f64(), n);
    let after = backends_cpu(baseline, LIMIT_APPLICATION_NAME).await?;
    let spent: f64 = after.iter().map(|(pid, cpu)| cpu - before.get(pid).copied().unwrap_or(0.0)).sum();
    let backends_cpu_us_per_event = (!after.is_empty()).then(|| spent * 1e6 / n as f64);
    Ok(Limit { events_per_s, backends_cpu_us_per_event, machine })
}

/// What a limit phase needs besides its protocol and consumer count.
#[derive(Clone, Copy)]
struct LimitSetup<'a> {
    baseline: &'a Baseline,
    /// The database URL with the limit's application_name.
    url: &'a DbUrl,
    pool_size: u32,
    size: (usize, usize),
    batch: i64,
}

/// One limit phase: `tasks` consumers of `protocol` on a fresh, warmed pool.
/// With one pool for every phase (2026-12-02) the limit fell phase after
/// phase within a run, 63,000 to 48,000 events/s, its backends' CPU per
/// event rising, while haunt's phases after them did not fall.
async fn limit_phase(setup: LimitSetup<'_>, protocol: Protocol, tasks: usize) -> anyhow::Result<Limit> {
    let phase = format!("server-side limit, {}, {tasks} consumers", protocol.name);
    let flags = (protocol.ack_in_apply, protocol.async_lease_ack);
    let limit_pool = Baseline::connect(setup.url, setup.pool_size).await?;
    limit_pool.warm(tasks as u32).await?;
    let pools = (setup.baseline, &limit_pool);
    let (n, batch) = (setup.size.0, setup.batch);
    let l = drain_phase(setup.baseline, setup.size, &phase, || server_side_at(pools, n, tasks, batch, flags)).await;
    limit_pool.close().await;
    l
}

/// haunt's drain against its limit measured alternately: the limit, then
/// haunt, `rounds` times, then the limit once more, so that each drain has a
/// limit measured just before and just after it. A run measures every limit
/// before any of haunt's phases, minutes apart; on a VM whose speed drifts
/// (the limit of one protocol moved by 40 % between runs of 2026-12-02) that
/// drift goes into the run's ratios, and the pairs keep it out.
#[derive(Debug, Clone)]
struct Paired {
    protocol: &'static str,
    consumers: usize,
    limits: Vec<f64>,
    haunt: Vec<f64>,
    /// Each drain against the mean of the limits on either side of it.
    ratios: Vec<f64>,
    /// What each limit drain and each of haunt's cost the machine.
    limits_use: Vec<Option<MachineUse>>,
    haunt_use: Vec<Option<MachineUse>>,
    /// Worker processes' starts, each outside its drain's time (none where
    /// their clock starts at the spawn).
    starts_s: Vec<f64>,
    /// Whether `haunt worker` processes drained (their report says what their
    /// clock started at).
    of_processes: bool,
}

async fn paired<Fut>(
    setup: LimitSetup<'_>,
    protocol: Protocol,
    tasks: usize,
    drain: impl Fn() -> Fut,
    rounds: usize,
) -> anyhow::Result<Paired>
where
    Fut: std::future::Future<Output = anyhow::Result<Timed>>,
{
    let first = limit_phase(setup, protocol, tasks).await?;
    let (mut limits, mut limits_use) = (vec![first.events_per_s], vec![first.machine]);
    let (mut haunt, mut haunt_use) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    let mut starts_s = Vec::new();
    for _ in 0..rounds {
        let timed = drain_phase(setup.baseline, setup.size, "haunt workers, paired", &drain).await?;
        haunt.push(timed.events_per_s);
        haunt_use.push(timed.machine);
        starts_s.extend(timed.start_s);
        let limit = limit_phase(setup, protocol, tasks).await?;
        limits.push(limit.events_per_s);
        limits_use.push(limit.machine);
    }
    let ratios: Vec<f64> = haunt.iter().zip(limits.windows(2)).map(|(h, l)| h / ((l[0] + l[1]) / 2.0)).collect();
    Ok(Paired {
        protocol: protocol.name,
        consumers: tasks,
        limits,
        haunt,
        ratios,
        limits_use,
        haunt_use,
        starts_s,
        of_processes: false,
    })
}

impl Paired {
    /// The median of the rounds' ratios (nearest rank, as the checker's
    /// quantiles), NaN with no round.
    fn median_ratio(&self) -> f64 {
        haunt_checker::stats::quantile(&mut self.ratios.clone(), 0.5).unwrap_or(f64::NAN)
    }

    /// `; the machine: …` with each side's median CPU per event (and the
    /// kernel's part, switches and faults) and busy share, or nothing where
    /// /proc said nothing.
    fn machine_line(&self) -> String {
        let side = |uses: &[Option<MachineUse>]| {
            let median = |f| machine_median(uses, f);
            let (Some(cpu), Some(busy)) = (median(|u| u.cpu_us_per_event), median(|u| u.busy_share)) else {
                return None;
            };
            let kernel = median(|u| u.kernel_us_per_event).unwrap_or(f64::NAN);
            let switches = median(|u| u.switches_per_event).unwrap_or(f64::NAN);
            let faults = median(|u| u.faults_per_event).unwrap_or(f64::NAN);
            Some(format!(
                "{cpu:.1} us/event ({kernel:.1} in the kernel; {switches:.2} context switches, {faults:.2} page faults), \
                 {:.0} % of the cores busy",
                busy * 100.0
            ))
        };
        match (side(&self.limits_use), side(&self.haunt_use)) {
            (Some(limit), Some(haunt)) => format!("; the machine: limit {limit}, haunt {haunt}"),
            _ => String::new(),
        }
    }

    /// What the worker processes' clock started at.
    fn timed_from(&self) -> &'static str {
        timed_from(self.starts_s.first().copied())
    }

    fn json(&self) -> serde_json::Value {
        let mut json = json!({
            "protocol": self.protocol,
            "consumers": self.consumers,
            "limits": self.limits,
            "haunt": self.haunt,
            "ratios": self.ratios,
            "median_ratio": self.median_ratio(),
            "machine": {
                "limits": machine_use_json(&self.limits_use),
                "haunt": machine_use_json(&self.haunt_use),
            },
        });
        if self.of_processes {
            json["timed_from"] = json!(self.timed_from());
            json["starts_s"] = json!(self.starts_s);
        }
        json
    }
}

/// The median of one figure of the drains' [`MachineUse`], `None` where
/// /proc said nothing.
fn machine_median(uses: &[Option<MachineUse>], f: fn(&MachineUse) -> f64) -> Option<f64> {
    let mut values: Vec<f64> = uses.iter().flatten().map(f).collect();
    haunt_checker::stats::quantile(&mut values, 0.5)
}

/// The medians of the drains' [`MachineUse`] as the report writes them.
fn machine_use_json(uses: &[Option<MachineUse>]) -> serde_json::Value {
    json!({
        "cpu_us_per_event_median": machine_median(uses, |u| u.cpu_us_per_event),
        "busy_share_median": machine_median(uses, |u| u.busy_share),
        "kernel_us_per_event_median": machine_median(uses, |u| u.kernel_us_per_event),
        "steal_share_median": machine_median(uses, |u| u.steal_share),
        "switches_per_event_median": machine_median(uses, |u| u.switches_per_event),
        "faults_per_event_median": machine_median(uses, |u| u.faults_per_event),
    })
}

/// Runs every phase (or, with `profile_worker`, only the profiled worker
/// process) on `options.db`, which must be empty and is left empty, and
/// returns the report. `progress` gets a line per phase with its figures.
pub fn pipeline(
    options: PipelineOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> futures_util::future::LocalBoxFuture<'_, anyhow::Result<serde_json::Value>> {
    // Boxed in this crate, as `haunt_chaos::assemble::run_interruptible` says why.
    Box::pin(pipeline_run(options, progress))
}

async fn pipeline_run(
    options: PipelineOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        options.events > 0 && options.workers > 0 && options.clients > 0,
        "--events, --workers, --clients > 0"
    );
    anyhow::ensure!(
        options.batch_size > 0 && !options.sweep_batch_sizes.contains(&0) && !options.sweep_workers.contains(&0),
        "batch sizes and worker counts must be positive"
    );
    // Opening it migrates it; it must hold nothing the bench would delete.
    // Its leases and acks are durable: the per-message phase drains through it,
    // the tutorial's design, which knows nothing of asynchronous commits.
    let store = Store::connect(
        &options.db,
        StoreOptions { max_connections: 32, async_lease_ack: false, ..StoreOptions::default() },
    )
    .await
    .with_context(|| format!("opening {}", options.db))?;
    ensure_empty(&store, &options.db).await?;
    let pgmq = options.pgmq_sql.as_deref().map(|p| PgmqSql::read(p, &options.db)).transpose()?;
    let baseline = Baseline::connect(&options.db, 32).await?;
    if let Some(sql) = &pgmq {
        // Tried once before any phase, so that a file that is not pgmq's
        // fails the bench at once, not after its other phases.
        baseline.pgmq_install(&sql.text).await.with_context(|| format!("installing {}", sql.path.display()))?;
        baseline.pgmq_uninstall().await?;
    }
    let bench = Bench { options: &options, store: &store, baseline: &baseline, progress, pgmq };
    let report = match &options.profile_worker {
        Some(wrapper) => bench.profiled(wrapper).await?,
        None => bench.every_phase().await?,
    };
    baseline.housekeeping_back_on().await?;
    baseline.close().await;
    store.close().await;
    Ok(serde_json::Value::Object(report))
}

/// Items the bench's orders are spread over.
const ITEMS: usize = 64;

/// One run of the pipeline bench: what each phase needs.
struct Bench<'a> {
    options: &'a PipelineOptions,
    store: &'a Store,
    baseline: &'a Baseline,
    progress: &'a mut dyn FnMut(&str),
    /// pgmq's SQL, when the bench pairs haunt with a consumer over pgmq.
    pgmq: Option<PgmqSql>,
}

/// The server-side limit of each protocol: the best over the consumer counts.
struct Limits {
    /// Each protocol's limit at its best count.
    best: Vec<(Protocol, Limit)>,
    /// The best count of each protocol, by name.
    best_at: serde_json::Map<String, serde_json::Value>,
    /// Every count's figure, by protocol name.
    by_consumers: serde_json::Map<String, serde_json::Value>,
}

impl Limits {
    fn of(&self, p: Protocol) -> Option<f64> {
        self.best.iter().find(|(q, _)| *q == p).map(|(_, l)| l.events_per_s)
    }
}

/// The three client-side SQL baselines: at their own batch, at haunt's, and
/// locked in one transaction a batch (PostgreSQL only).
type ClientSql = (Option<f64>, Option<f64>, Option<f64>);

impl<'a> Bench<'a> {
    fn size(&self) -> (usize, usize) {
        (self.options.events, ITEMS)
    }

    fn command(&self) -> WorkerCommand<'a> {
        WorkerCommand {
            haunt: &self.options.haunt,
            db: &self.options.db,
            rust_log: self.options.worker_rust_log.as_str(),
            spans: Some(&self.options.worker_spans),
            batch_size: self.options.batch_size,
            metrics: false,
            wrapper: None,
        }
    }

    /// What every report starts with: the machine and the run's sizes.
    fn header(&self) -> serde_json::Map<String, serde_json::Value> {
        let o = self.options;
        let mut report = serde_json::Map::new();
        report.insert("machine".into(), json!(crate::machine()));
        report.insert("db".into(), json!(if o.db.is_postgres() { "postgres" } else { "sqlite" }));
        report.insert("events".into(), json!(o.events));
        report.insert("workers".into(), json!(o.workers));
        report.insert("clients".into(), json!(o.clients));
        report.insert("batch_size".into(), json!(o.batch_size));
        report
    }

    /// The only phase of `--profile-worker`: a worker process under `wrapper`.
    async fn profiled(self, wrapper: &str) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
        let mut report = self.header();
        let (n, command) = (self.options.events, self.command());
        let w = drain_phase(self.baseline, self.size(), "profiled worker process", || {
            worker_process(self.baseline, WorkerCommand { wrapper: Some(wrapper), ..command }, n, self.store)
        })
        .await?;
        (self.progress)(&format!("haunt worker process under {wrapper:?}: {:>10.0} events/s", w.events_per_s));
        report.insert("profile_worker".into(), json!(wrapper));
        report.insert("worker_process".into(), w.json(n, &command));
        Ok(report)
    }

    /// The setup of every limit phase, over a pool as large as the largest count.
    fn limit_setup<'b>(&self, url: &'b DbUrl, counts: &[usize]) -> LimitSetup<'b>
    where
        'a: 'b,
    {
        let pool_size = *counts.last().unwrap_or(&1) as u32;
        LimitSetup {
            baseline: self.baseline,
            url,
            pool_size,
            size: self.size(),
            batch: i64::from(self.options.batch_size),
        }
    }

    /// The limit: haunt's protocol inside the database, at haunt's batch size.
    /// With commits that wait for the WAL flush, concurrency is throughput up
    /// to a point, past which the consumers contend on one queue; so the limit
    /// is the best of several consumer counts (2, 4, 8 and as many as haunt's
    /// workers run lease loops), the strongest baseline, not the one at
    /// haunt's own count. SQLite has one writer, so one connection is its
    /// limit, and no asynchronous commits. On PostgreSQL each protocol runs
    /// twice: every commit durable, and the lease's and the ack's commits
    /// asynchronous, as haunt's workers commit them by default
    /// (`StoreOptions::async_lease_ack`).
    async fn limits(&mut self, setup: LimitSetup<'_>, counts: &[usize]) -> anyhow::Result<Limits> {
        let mut limits =
            Limits { best: Vec::new(), best_at: serde_json::Map::new(), by_consumers: serde_json::Map::new() };
        for protocol in self.protocols() {
            let mut best: Option<(usize, Limit)> = None;
            let mut figures = serde_json::Map::new();
            for &tasks in counts {
                let l = limit_phase(setup, protocol, tasks).await?;
                figures.insert(tasks.to_string(), json!(l.events_per_s));
                if best.as_ref().is_none_or(|(_, b)| l.events_per_s > b.events_per_s) {
                    best = Some((tasks, l));
                }
            }
            let (tasks, l) = best.context("at least one consumer count")?;
            (self.progress)(&format!(
                "server-side limit, {:<34} {:>10.0} events/s (best at {tasks} consumers), its backends {:.1} us/event",
                protocol.name,
                l.events_per_s,
                l.backends_cpu_us_per_event.unwrap_or(f64::NAN)
            ));
            limits.by_consumers.insert(protocol.name.to_owned(), serde_json::Value::Object(figures));
            limits.best_at.insert(protocol.name.to_owned(), json!(tasks));
            limits.best.push((protocol, l));
        }
        Ok(limits)
    }

    /// The protocols the database can run: on SQLite the asynchronous commits
    /// do not exist.
    fn protocols(&self) -> impl Iterator<Item = Protocol> + use<> {
        let postgres = self.options.db.is_postgres();
        Protocol::ALL.into_iter().filter(move |p| postgres || !p.async_lease_ack)
    }

    async fn client_sql(&mut self) -> anyhow::Result<ClientSql> {
        let baseline = self.baseline;
        if !baseline.has_client_sql_baseline() {
            return Ok((None, None, None));
        }
        let (n, workers, size) = (self.options.events, self.options.workers, self.size());
        let batch = i64::from(self.options.batch_size);
        let at = |batch: i64| {
            let b = baseline.clone();
            timed(n, workers, move |t| {
                let b = b.clone();
                async move { Ok(b.client_sql_drain(t, batch).await?) }
            })
        };
        let plain = |phase| (phase, Record::Plain);
        let rate =
            drain_phase_keeping(baseline, size, plain("client-side SQL baseline"), || at(CLIENT_SQL_BATCH)).await?;
        (self.progress)(&format!(
            "client-side SQL, batch {CLIENT_SQL_BATCH:<4}                  {rate:>10.0} events/s"
        ));
        let same_batch =
            drain_phase_keeping(baseline, size, plain("client-side SQL baseline at haunt's batch size"), || at(batch))
                .await?;
        (self.progress)(&format!("client-side SQL, batch {batch:<4}                  {same_batch:>10.0} events/s"));
        let b = baseline.clone();
        let locked = drain_phase_keeping(baseline, size, plain("client-side SQL, locked"), || {
            timed(n, workers, move |_| {
                let b = b.clone();
                async move { Ok(b.client_sql_locked_drain(CLIENT_SQL_BATCH).await?) }
            })
        })
        .await?;
        (self.progress)(&format!("client-side SQL, locked, one txn per batch  {locked:>10.0} events/s"));
        Ok((Some(rate), Some(same_batch), Some(locked)))
    }

    /// The tutorial's design, lease one, apply it, ack it, over as many
    /// tasks as haunt's lease loops: the events drained, and the rate.
    async fn per_message(&mut self, lease_loops: usize) -> anyhow::Result<(usize, f64)> {
        let s = self.store.clone();
        let pm = self.options.events.min(PER_MESSAGE_EVENTS_MAX);
        let per_message = drain_phase(self.baseline, (pm, ITEMS), "per-message", || {
            timed(pm, lease_loops, move |_| per_message_drain(s.clone()))
        })
        .await?;
        (self.progress)(&format!("per-message (3 txn/event)                   {per_message:>10.0} events/s"));
        Ok((pm, per_message))
    }

    /// haunt's workers under each protocol the database can run, each
    /// against the limit of its own protocol: (protocol, rate, limit).
    async fn haunt_workers(&mut self, limits: &Limits) -> anyhow::Result<Vec<(Protocol, f64, f64)>> {
        let o = self.options;
        let mut haunt = Vec::new();
        for protocol in self.protocols() {
            let how = Drain { batch_size: o.batch_size, protocol };
            let rate = drain_phase(self.baseline, self.size(), &format!("haunt workers, {}", protocol.name), || {
                haunt_rate(&o.db, o.workers, how, o.events)
            })
            .await?;
            let limit = limits.of(protocol).context("a limit for each protocol haunt runs")?;
            (self.progress)(&format!(
                "haunt workers, {:<34} {rate:>10.0} events/s: {:.2} of its limit",
                protocol.name,
                rate / limit
            ));
            haunt.push((protocol, rate, limit));
        }
        Ok(haunt)
    }

    /// The paired measurement of each of `protocols` (the default and
    /// `--ack-in-txn`), at the consumer count of its best limit.
    async fn paired(
        &mut self,
        setup: LimitSetup<'_>,
        limits: &Limits,
        protocols: [Protocol; 2],
    ) -> anyhow::Result<Vec<Paired>> {
        let o = self.options;
        let mut pairs = Vec::new();
        for protocol in protocols.into_iter().filter(|_| o.paired_rounds > 0) {
            let tasks =
                limits.best_at.get(protocol.name).and_then(|t| t.as_u64()).context("the protocol's best count")?
                    as usize;
            let how = Drain { batch_size: o.batch_size, protocol };
            let drain = || haunt_rate_and_use(&o.db, o.workers, how, o.events);
            let p = paired(setup, protocol, tasks, drain, o.paired_rounds).await?;
            (self.progress)(&format!(
                "paired, {:<40} {:.2} of its limit (median of {}: {}){}",
                protocol.name,
                p.median_ratio(),
                p.ratios.len(),
                p.ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", "),
                p.machine_line()
            ));
            pairs.push(p);
        }
        if o.paired_rounds > 0 {
            pairs.push(self.paired_processes(setup, limits, protocols[0]).await?);
        }
        Ok(pairs)
    }

    /// The default paired once more, drained by `haunt worker` processes as
    /// `haunt run` starts them (as many as the in-process drain has workers):
    /// the worker's default log level (`info`) and spans, its metrics served.
    async fn paired_processes(
        &mut self,
        setup: LimitSetup<'_>,
        limits: &Limits,
        default: Protocol,
    ) -> anyhow::Result<Paired> {
        let o = self.options;
        let tasks =
            limits.best_at.get(default.name).and_then(|t| t.as_u64()).context("the protocol's best count")? as usize;
        let command = WorkerCommand { rust_log: "info", spans: None, metrics: true, ..self.command() };
        let store = self.store;
        let drain = || worker_processes(setup.baseline, command, o.workers, o.events, store);
        let mut p = paired(setup, default, tasks, drain, o.paired_rounds).await?;
        p.of_processes = true;
        (self.progress)(&format!(
            "paired, {} haunt worker processes as haunt run starts them (RUST_LOG=info, metrics served, timed from \
             their {}) {:.2} of the limit of {} (median of {}: {}){}",
            o.workers,
            p.timed_from(),
            p.median_ratio(),
            default.name,
            p.ratios.len(),
            p.ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", "),
            p.machine_line()
        ));
        Ok(p)
    }

    /// haunt's default drain paired with the consumer over pgmq (when given
    /// its SQL): pgmq, haunt, pgmq, … pgmq, each of haunt's drains against the
    /// mean of the two around it; at least one round.
    async fn against_pgmq(&mut self, lease_loops: usize, default: Protocol) -> anyhow::Result<Option<AgainstPgmq>> {
        let o = self.options;
        let Some(sql) = self.pgmq.clone() else {
            (self.progress)(
                "pgmq, client-side: not measured (--pgmq-sql FILE: docs/performance.md says where pgmq's SQL is)",
            );
            return Ok(None);
        };
        self.baseline.pgmq_install(&sql.text).await.with_context(|| format!("installing {}", sql.path.display()))?;
        let measured = async {
            let (size, batch) = (self.size(), i64::from(o.batch_size));
            let mut pgmq = vec![pgmq_phase(self.baseline, &o.db, size, lease_loops, batch).await?];
            let mut haunt = Vec::new();
            let how = Drain { batch_size: o.batch_size, protocol: default };
            for _ in 0..o.paired_rounds.max(1) {
                haunt.push(
                    drain_phase(self.baseline, size, "haunt workers, paired with pgmq", || {
                        haunt_drain(&o.db, o.workers, how, o.events, Some(self.baseline))
                    })
                    .await?,
                );
                pgmq.push(pgmq_phase(self.baseline, &o.db, size, lease_loops, batch).await?);
            }
            let ratios = haunt
                .iter()
                .zip(pgmq.windows(2))
                .map(|(h, p)| h.events_per_s / ((p[0].events_per_s + p[1].events_per_s) / 2.0))
                .collect();
            let sql = (sql.path.clone(), sql.text.len());
            anyhow::Ok(AgainstPgmq {
                sql,
                consumers: lease_loops,
                pgmq: pgmq.iter().map(|d| d.events_per_s).collect(),
                haunt: haunt.iter().map(|d| d.events_per_s).collect(),
                ratios,
                pgmq_cpu: pgmq.iter().map(|d| d.cpu).collect(),
                haunt_cpu: haunt.iter().map(|d| d.cpu).collect(),
                pgmq_wal: pgmq.iter().map(|d| d.wal_bytes).collect(),
                haunt_wal: haunt.iter().map(|d| d.wal_bytes).collect(),
                events: o.events,
            })
        }
        .await;
        // Dropped whatever happened: the schema is the bench's own.
        self.baseline.pgmq_uninstall().await?;
        let against = measured?;
        (self.progress)(&format!(
            "paired, haunt {} against pgmq client-side ({} consumers): {:.2} (median of {}: {}); pgmq {} events/s",
            default.name,
            lease_loops,
            against.median_ratio(),
            against.ratios.len(),
            against.ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", "),
            against.pgmq.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", "),
        ));
        let cpu = |drains| {
            against.cpu_us_per_event(drains).map_or("not measured".into(), |(machine, own)| {
                format!("{machine:.1} us/event on the machine, {own:.1} of them in its consumers")
            })
        };
        (self.progress)(&format!(
            "  CPU (medians): pgmq {}; haunt {}",
            cpu(&against.pgmq_cpu),
            cpu(&against.haunt_cpu)
        ));
        let wal =
            |drains| against.wal_bytes_per_event(drains).map_or("not measured".into(), |b| format!("{b:.0} B/event"));
        (self.progress)(&format!(
            "  WAL the server wrote (medians): pgmq {}; haunt {}",
            wal(&against.pgmq_wal),
            wal(&against.haunt_wal)
        ));
        Ok(Some(against))
    }

    /// A worker process of its own, at the batch size measured above: memory,
    /// CPU, and what its connections cost the server.
    async fn worker_process(&mut self, default: Protocol, limit: f64) -> anyhow::Result<WorkerProcess> {
        let (n, command) = (self.options.events, self.command());
        let process = drain_phase(self.baseline, self.size(), "worker process", || {
            worker_process(self.baseline, command, n, self.store)
        })
        .await?;
        (self.progress)(&format!(
            "haunt worker process, batch {:>4}, RUST_LOG={}: {:.0} events/s ({:.2} of the limit of its protocol, \
             {}), peak RSS {:.1} MiB, CPU {:.1} us/event, its server backends {:.1} us/event",
            self.options.batch_size,
            self.options.worker_rust_log,
            process.events_per_s,
            process.events_per_s / limit,
            default.name,
            process.peak_rss_mib.unwrap_or(f64::NAN),
            process.cpu_s.map_or(f64::NAN, |c| c * 1e6 / n as f64),
            process.backends_cpu_s.map_or(f64::NAN, |c| c * 1e6 / n as f64),
        ));
        Ok(process)
    }

    /// Orders per second: raw insert transactions, then the API over HTTP.
    async fn ingest(&mut self) -> anyhow::Result<(f64, f64)> {
        let (n, clients) = (self.options.events, self.options.clients);
        let b = self.baseline.clone();
        let raw_insert = timed(n, clients, move |c| {
            let b = b.clone();
            async move { Ok(b.raw_ingest(c, clients, n).await?) }
        })
        .await?;
        self.baseline.reset().await?;
        (self.progress)(&format!("raw insert txn ({clients} clients)                {raw_insert:>10.0} orders/s"));

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/orders", listener.local_addr()?);
        let api_store =
            Store::connect(&self.options.db, StoreOptions { max_connections: 32, ..StoreOptions::default() }).await?;
        let server = tokio::spawn(haunt_api::run(
            listener,
            api_store,
            haunt_api::ApiConfig::default(),
            Box::pin(std::future::pending()),
        ));
        let http = reqwest::Client::builder().pool_max_idle_per_host(clients).build()?;
        let api = timed(n, clients, move |c| http_ingest(http.clone(), url.clone(), c, clients, n)).await?;
        server.abort();
        self.baseline.reset().await?;
        (self.progress)(&format!("API over HTTP ({clients} clients)                 {api:>10.0} orders/s"));
        Ok((raw_insert, api))
    }

    /// The drain at each batch size and worker count of the sweep.
    async fn sweep(&mut self, default: Protocol) -> anyhow::Result<Vec<serde_json::Value>> {
        let o = self.options;
        let mut sweep = Vec::new();
        for &batch in &o.sweep_batch_sizes {
            for &workers in &o.sweep_workers {
                let rate = drain_phase(self.baseline, self.size(), "sweep", || {
                    haunt_rate(&o.db, workers, Drain { batch_size: batch, protocol: default }, o.events)
                })
                .await?;
                (self.progress)(&format!("sweep: batch {batch:>4}, {workers} workers  {rate:>10.0} events/s"));
                sweep.push(json!({"batch_size": batch, "workers": workers, "events_per_s": rate}));
            }
        }
        Ok(sweep)
    }

    /// Every phase in turn, and the report of their figures.
    async fn every_phase(mut self) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
        let o = self.options;
        let postgres = o.db.is_postgres();
        let lease_loops = o.workers * haunt_worker::WorkerConfig::default().concurrency;
        let mut counts: Vec<usize> = if postgres { vec![2, 4, 8, lease_loops] } else { vec![1] };
        counts.sort_unstable();
        counts.dedup();
        self.baseline.install_server_side().await?;
        let limit_url = named(&o.db, LIMIT_APPLICATION_NAME);
        let setup = self.limit_setup(&limit_url, &counts);
        let limits = self.limits(setup, &counts).await?;
        let client_sql = self.client_sql().await?;
        let per_message = self.per_message(lease_loops).await?;
        let haunt = self.haunt_workers(&limits).await?;
        let (default, default_in_txn) = (Protocol::default_for(postgres, false), Protocol::default_for(postgres, true));
        let pairs = self.paired(setup, &limits, [default, default_in_txn]).await?;
        self.baseline.drop_server_side().await?;
        let pgmq = self.against_pgmq(lease_loops, default).await?;
        let process = self.worker_process(default, limits.of(default).unwrap_or(f64::NAN)).await?;
        let ingest = self.ingest().await?;
        let sweep = self.sweep(default).await?;
        let figures =
            Figures { lease_loops, limits, client_sql, per_message, haunt, pairs, pgmq, process, ingest, sweep };
        Ok(figures.report(self.header(), &self.command(), o, [default, default_in_txn]))
    }
}

/// What every phase of a run measured.
struct Figures {
    lease_loops: usize,
    limits: Limits,
    client_sql: ClientSql,
    /// Its events, and its rate.
    per_message: (usize, f64),
    haunt: Vec<(Protocol, f64, f64)>,
    pairs: Vec<Paired>,
    /// The rounds against pgmq, when measured.
    pgmq: Option<AgainstPgmq>,
    process: WorkerProcess,
    /// Raw inserts and the API, orders/s.
    ingest: (f64, f64),
    sweep: Vec<serde_json::Value>,
}

impl Figures {
    /// The report: `report` (the header) with every figure and the ratios;
    /// `n`: the events of each drain.
    fn report(
        self,
        mut report: serde_json::Map<String, serde_json::Value>,
        command: &WorkerCommand<'_>,
        options: &PipelineOptions,
        [default, default_in_txn]: [Protocol; 2],
    ) -> serde_json::Map<String, serde_json::Value> {
        let n = options.events;
        let Figures { lease_loops, mut limits, client_sql, per_message, haunt, pairs, pgmq, process, ingest, sweep } =
            self;
        let (client_sql, client_sql_same_batch, client_sql_locked) = client_sql;
        let (pm, per_message) = per_message;
        let (raw_insert, api) = ingest;
        let rate_of = |p: Protocol| haunt.iter().find(|(q, ..)| *q == p).map(|h| h.1).unwrap_or(f64::NAN);
        let (haunt_default, haunt_ack_in_txn) = (rate_of(default), rate_of(default_in_txn));
        let limit_default = limits.of(default).unwrap_or(f64::NAN);
        let (limit_3, limit_2) =
            (limits.of(Protocol::THREE).unwrap_or(f64::NAN), limits.of(Protocol::TWO).unwrap_or(f64::NAN));
        let limit_cpu: serde_json::Map<String, serde_json::Value> =
            limits.best.iter().map(|(p, l)| (p.key("server_side_limit"), json!(l.backends_cpu_us_per_event))).collect();

        report.insert(
            "server_side_consumers_best".into(),
            serde_json::Value::Object(std::mem::take(&mut limits.best_at)),
        );
        report.insert(
            "server_side_limit_by_consumers".into(),
            serde_json::Value::Object(std::mem::take(&mut limits.by_consumers)),
        );
        report.insert("lease_loops".into(), json!(lease_loops));
        report.insert("per_message_events".into(), json!(pm));
        report.insert("haunt_protocol".into(), json!({"default": default.name, "ack_in_txn": default_in_txn.name}));
        let mut events_per_s = serde_json::Map::new();
        for (protocol, l) in &limits.best {
            events_per_s.insert(protocol.key("server_side_limit"), json!(l.events_per_s));
        }
        for (protocol, rate, _) in &haunt {
            events_per_s.insert(protocol.key("haunt_workers"), json!(rate));
        }
        for (key, value) in [
            ("client_sql_baseline", client_sql),
            ("client_sql_baseline_same_batch", client_sql_same_batch),
            ("client_sql_locked_one_txn", client_sql_locked),
            ("per_message", Some(per_message)),
            ("haunt_workers", Some(haunt_default)),
            ("haunt_workers_ack_in_txn", Some(haunt_ack_in_txn)),
            ("worker_process", Some(process.events_per_s)),
        ] {
            events_per_s.insert(key.into(), json!(value));
        }
        report.insert("events_per_s".into(), serde_json::Value::Object(events_per_s));
        report.insert("worker_process".into(), process.json(n, command));
        report.insert("postgres_backends_cpu_us_per_event".into(), serde_json::Value::Object(limit_cpu));
        report.insert("worker_peak_rss_mib".into(), json!(process.peak_rss_mib));
        report.insert("orders_per_s".into(), json!({"raw_insert_txn": raw_insert, "api_http": api}));
        // Each of haunt's protocols against the limit of the same protocol, and
        // haunt's defaults against the durable limits too.
        let mut ratios: serde_json::Map<String, serde_json::Value> =
            haunt.iter().map(|(p, rate, limit)| (p.key("haunt_vs_server_side"), json!(rate / limit))).collect();
        for (key, value) in [
            ("haunt_vs_own_limit", Some(haunt_default / limit_default)),
            ("haunt_ack_in_txn_vs_own_limit", limits.of(default_in_txn).map(|l| haunt_ack_in_txn / l)),
            ("haunt_default_vs_server_side_3_commits_durable", Some(haunt_default / limit_3)),
            ("haunt_ack_in_txn_default_vs_server_side_2_commits_durable", Some(haunt_ack_in_txn / limit_2)),
            ("worker_process_vs_own_limit", Some(process.events_per_s / limit_default)),
            ("haunt_vs_client_sql_baseline", client_sql.map(|r| haunt_default / r)),
            ("haunt_vs_client_sql_baseline_same_batch", client_sql_same_batch.map(|r| haunt_default / r)),
            ("haunt_vs_client_sql_locked_one_txn", client_sql_locked.map(|r| haunt_default / r)),
            ("haunt_vs_per_message", Some(haunt_default / per_message)),
            ("api_vs_raw_insert", Some(api / raw_insert)),
        ] {
            ratios.insert(key.into(), json!(value));
        }
        if let [p, in_txn, processes] = &pairs[..] {
            ratios.insert("haunt_vs_own_limit_paired".into(), json!(p.median_ratio()));
            ratios.insert("haunt_ack_in_txn_vs_own_limit_paired".into(), json!(in_txn.median_ratio()));
            ratios.insert("worker_processes_vs_own_limit_paired".into(), json!(processes.median_ratio()));
            report.insert("paired".into(), p.json());
            report.insert("paired_ack_in_txn".into(), in_txn.json());
            let mut processes = processes.json();
            processes["workers"] = json!(options.workers);
            processes["rust_log"] = json!("info");
            processes["metrics_served"] = json!(true);
            report.insert("paired_worker_processes".into(), processes);
        }
        ratios.insert("haunt_vs_pgmq_client_side_paired".into(), json!(pgmq.as_ref().map(AgainstPgmq::median_ratio)));
        report.insert("pgmq".into(), pgmq.map_or(serde_json::Value::Null, |p| p.json(options.batch_size)));
        report.insert("ratios".into(), serde_json::Value::Object(ratios));
        if !sweep.is_empty() {
            report.insert("sweep".into(), json!(sweep));
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watcher's reads of a drain whose count at time t is `count(t)`, until
    /// it sees `n`: how many reads, and how long after the drain's end the
    /// last one came.
    fn watch(n: i64, count: impl Fn(Duration) -> i64) -> (usize, Duration) {
        let (mut at, mut last, mut reads) = (Duration::ZERO, (Duration::ZERO, 0), 0);
        let end = (0..).map(|us| Duration::from_micros(us * 100)).find(|&t| count(t) >= n).expect("the drain ends");
        loop {
            reads += 1;
            let done = count(at);
            if done >= n {
                return (reads, at - end);
            }
            let wait = next_read(last, (at, done), n);
            assert!(wait >= READ_EVERY_MIN && wait <= READ_EVERY_MAX, "{wait:?}");
            last = (at, done);
            at += wait;
        }
    }

    #[test]
    fn a_watcher_with_nothing_in_yet_reads_again_at_the_shortest_wait() {
        assert_eq!(next_read((Duration::ZERO, 0), (Duration::from_millis(30), 0), 50_000), READ_EVERY_MIN);
        assert_eq!(next_read((Duration::ZERO, 0), (Duration::ZERO, 0), 50_000), READ_EVERY_MIN);
    }

    #[test]
    fn a_steady_drain_is_read_a_few_times_and_its_end_seen_within_the_shortest_wait() {
        // 50,000 events at 50,000 a second, after 40 ms with nothing in.
        let count = |t: Duration| ((t.as_secs_f64() - 0.04).max(0.0) * 50_000.0) as i64;
        let (reads, late) = watch(50_000, count);
        assert!(late <= READ_EVERY_MIN, "seen {late:?} after the end");
        // Every 2 ms would be about 520 reads.
        assert!(reads < 60, "{reads} reads");
    }

    #[test]
    fn a_drain_that_speeds_up_threefold_is_still_seen_within_the_shortest_wait_of_its_end() {
        // A slow first half second, then three times the rate.
        let count = |t: Duration| {
            let s = t.as_secs_f64();
            if s < 0.5 { (s * 20_000.0) as i64 } else { 10_000 + ((s - 0.5) * 60_000.0) as i64 }
        };
        let (reads, late) = watch(50_000, count);
        assert!(late <= READ_EVERY_MIN, "seen {late:?} after the end");
        assert!(reads < 80, "{reads} reads");
    }
}
