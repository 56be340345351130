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
//!   transaction at the same concurrency.
//!
//! The database must be empty; the bench empties the pipeline's tables between
//! phases and at the end.
//!
//! The baselines and the resets are SQL on the pipeline's tables, so they live
//! in the store ([`haunt_store::Baseline`]); this file only calls them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use haunt_store::{AckMode, Baseline, LeaseClock, Store, StoreOptions};
use serde_json::json;

use crate::worker_process::{WorkerCommand, cpu_seconds, worker_process};

/// What the pipeline bench runs.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// The `haunt` executable the worker process is started from.
    pub haunt: PathBuf,
    /// The database: an empty one (postgres://… for every phase; sqlite://…
    /// leaves out the PostgreSQL-only client-side SQL baselines).
    pub db: String,
    /// Events pre-enqueued for each drain phase, and orders sent for each ingest phase.
    pub events: usize,
    /// Worker processes' worth of consumers (each with its own connection pool).
    pub workers: usize,
    /// Concurrent clients for the ingest phases.
    pub clients: usize,
    /// Messages per batch for haunt's workers (their --batch-size-max).
    pub batch_size: u32,
    /// Also drain with each of these batch sizes for each count of
    /// `sweep_workers`: the data of the throughput plot.
    pub sweep_batch_sizes: Vec<u32>,
    /// The worker counts of the sweep.
    pub sweep_workers: Vec<usize>,
    /// RUST_LOG of the `haunt worker` process the bench starts.
    pub worker_rust_log: String,
    /// Run only one phase: `events` pre-enqueued, drained by a `haunt worker`
    /// process started under this command (split at spaces, the worker's own
    /// command line appended). The command is sent SIGINT once the queue is
    /// empty, so that a profiler writes its data.
    pub profile_worker: Option<String>,
}

/// Messages per batch of the client-side SQL baseline, as in issue 8's
/// pgbench script.
const CLIENT_SQL_BATCH: i64 = 100;

/// Events of the per-message phase at most: three commits per event make it
/// one to two orders of magnitude slower than the batched phases, and 2,000
/// events are seconds of it, enough for a steady rate.
const PER_MESSAGE_EVENTS_MAX: usize = 2_000;

/// The PostgreSQL application_name of the server-side limit's connections.
const LIMIT_APPLICATION_NAME: &str = "haunt-bench-limit";

/// Every event applied once, the queue empty: a phase that cheated would show.
async fn verify_drained(baseline: &Baseline, n: usize, phase: &str) -> anyhow::Result<()> {
    let haunt_store::DrainCounts { queued, applied_events: applied, ledger_rows: rows, projection_total: total } =
        baseline.drain_counts().await?;
    anyhow::ensure!(
        queued == 0 && applied == n as i64 && rows == n as i64 && total == n as i64,
        "{phase}: {queued} still queued, {applied} events applied in {rows} ledger rows, projection {total} (of {n})"
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

async fn haunt_drain(db: &str, workers: usize, (batch_size, ack): (u32, AckMode), n: usize) -> anyhow::Result<f64> {
    let mut running = Vec::new();
    let started = Instant::now();
    for w in 0..workers {
        let store = Store::connect(db, StoreOptions::default()).await?;
        let config = haunt_worker::WorkerConfig {
            worker_id: format!("bench-{w}"),
            batch_size_max: batch_size,
            ack,
            poll_interval: Duration::from_millis(5),
            ..haunt_worker::WorkerConfig::default()
        };
        let config = haunt_worker::RunConfig { worker: config, ..haunt_worker::RunConfig::default() };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        running.push((stop, tokio::spawn(haunt_worker::run(None, store, config, shutdown))));
    }
    let watcher = Store::connect(db, StoreOptions::default()).await?;
    wait_drained(&watcher, started, || Ok(())).await.with_context(|| format!("haunt's workers, {n} events"))?;
    let elapsed = started.elapsed().as_secs_f64();
    for (stop, task) in running {
        let _ = stop.send(());
        task.await.context("joining a worker")??;
    }
    watcher.close().await;
    Ok(n as f64 / elapsed)
}

/// One drain phase: `n` events enqueued, `measure` run, every event checked
/// applied once, the tables emptied for the next phase.
async fn drain_phase<T, Fut>(
    baseline: &Baseline,
    (n, items): (usize, usize),
    phase: &str,
    measure: impl FnOnce() -> Fut,
) -> anyhow::Result<T>
where
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    baseline.enqueue(n, items).await?;
    let value = measure().await?;
    verify_drained(baseline, n, phase).await?;
    baseline.reset().await?;
    Ok(value)
}

/// Returns once the queue is empty (every event applied: the phase's drain is
/// verified after). Polled at 20 ms, well inside a phase's seconds; `alive`
/// fails the wait early when the consumers died.
pub(crate) async fn wait_drained(
    watcher: &Store,
    started: Instant,
    mut alive: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    loop {
        let s = watcher.queue_stats().await?;
        if s.visible + s.leased + s.delayed == 0 {
            return Ok(());
        }
        alive()?;
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "not drained in 600 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `tasks` copies of `f` side by side and returns the events per second.
async fn timed<F, Fut>(n: usize, tasks: usize, f: F) -> anyhow::Result<f64>
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
pub(crate) fn named(url: &str, name: &str) -> String {
    if url.starts_with("postgres") {
        format!("{url}{}application_name={name}", if url.contains('?') { '&' } else { '?' })
    } else {
        url.to_owned()
    }
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
    let events_per_s = timed(n, tasks, move |t| {
        let b = b.clone();
        async move {
            b.server_side_drain(t, batch, ack_in_effect, async_lease_ack).await?;
            Ok(())
        }
    })
    .await?;
    let after = backends_cpu(baseline, LIMIT_APPLICATION_NAME).await?;
    let spent: f64 = after.iter().map(|(pid, cpu)| cpu - before.get(pid).copied().unwrap_or(0.0)).sum();
    let backends_cpu_us_per_event = (!after.is_empty()).then(|| spent * 1e6 / n as f64);
    Ok(Limit { events_per_s, backends_cpu_us_per_event })
}

/// Runs every phase (or, with `profile_worker`, only the profiled worker
/// process) on `options.db`, which must be empty and is left empty, and
/// returns the report. `progress` gets a line per phase with its figures.
pub async fn pipeline(options: PipelineOptions, mut progress: impl FnMut(&str)) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        options.events > 0 && options.workers > 0 && options.clients > 0,
        "--events, --workers, --clients > 0"
    );
    anyhow::ensure!(
        options.batch_size > 0 && !options.sweep_batch_sizes.contains(&0) && !options.sweep_workers.contains(&0),
        "batch sizes and worker counts must be positive"
    );
    let postgres = options.db.starts_with("postgres");
    // Opening it migrates it; it must hold nothing the bench would delete.
    let store = Store::connect(&options.db, StoreOptions { max_connections: 32, ..StoreOptions::default() })
        .await
        .with_context(|| format!("opening {}", options.db))?;
    anyhow::ensure!(store.is_empty().await?, "{} is not empty; the bench needs a database of its own", options.db);
    let baseline = Baseline::connect(&options.db, 32).await?;
    let n = options.events;
    let items = 64;
    let mut report = serde_json::Map::new();
    report.insert("machine".into(), json!(crate::machine()));
    report.insert("db".into(), json!(if postgres { "postgres" } else { "sqlite" }));
    report.insert("events".into(), json!(n));
    report.insert("workers".into(), json!(options.workers));
    report.insert("clients".into(), json!(options.clients));
    report.insert("batch_size".into(), json!(options.batch_size));
    let size = (n, items);
    let log = options.worker_rust_log.as_str();
    let command = WorkerCommand {
        haunt: &options.haunt,
        db: &options.db,
        rust_log: log,
        batch_size: options.batch_size,
        wrapper: None,
    };

    if let Some(wrapper) = &options.profile_worker {
        let w = drain_phase(&baseline, size, "profiled worker process", || {
            worker_process(&baseline, WorkerCommand { wrapper: Some(wrapper), ..command }, n, &store)
        })
        .await?;
        progress(&format!("haunt worker process under {wrapper:?}: {:>10.0} events/s", w.events_per_s));
        report.insert("profile_worker".into(), json!(wrapper));
        report.insert("worker_process".into(), w.json(n, log));
        baseline.close().await;
        store.close().await;
        return Ok(serde_json::Value::Object(report));
    }

    // The limit: haunt's protocol inside the database, at haunt's batch size.
    // With commits that wait for the WAL flush, concurrency is throughput up
    // to a point, past which the consumers contend on one queue; so the
    // limit is the best of several consumer counts (2, 4, 8 and as many as
    // haunt's workers run lease loops), the strongest baseline, not the one
    // at haunt's own count. SQLite has one writer, so one connection is its limit.
    let batch = i64::from(options.batch_size);
    let lease_loops = options.workers * haunt_worker::WorkerConfig::default().concurrency;
    let mut counts: Vec<usize> = if postgres { vec![2, 4, 8, lease_loops] } else { vec![1] };
    counts.sort_unstable();
    counts.dedup();
    let consumers = lease_loops.min(*counts.last().unwrap_or(&1));
    baseline.install_server_side().await?;
    let pool_size = *counts.last().unwrap_or(&1) as u32;
    let limit_pool = Baseline::connect(&named(&options.db, LIMIT_APPLICATION_NAME), pool_size).await?;
    let pools = (&baseline, &limit_pool);
    let mut limit = |name: &str, l: &Limit| {
        progress(&format!(
            "server-side limit, {name:<28} {:>10.0} events/s, its backends {:.1} us/event",
            l.events_per_s,
            l.backends_cpu_us_per_event.unwrap_or(f64::NAN)
        ))
    };
    // The best over the consumer counts, its count, and every count's figure.
    let mut by_consumers = serde_json::Map::new();
    let mut bests = Vec::new();
    for (commits, ack_in_effect) in [("3 commits", false), ("2 commits", true)] {
        let mut best: Option<(usize, Limit)> = None;
        let mut figures = serde_json::Map::new();
        for &tasks in &counts {
            let phase = format!("server-side limit, {commits}, {tasks} consumers");
            let l =
                drain_phase(&baseline, size, &phase, || server_side_at(pools, n, tasks, batch, (ack_in_effect, false)))
                    .await?;
            figures.insert(tasks.to_string(), json!(l.events_per_s));
            if best.as_ref().is_none_or(|(_, b)| l.events_per_s > b.events_per_s) {
                best = Some((tasks, l));
            }
        }
        by_consumers.insert(commits.to_owned(), serde_json::Value::Object(figures));
        bests.push(best.context("at least one consumer count")?);
    }
    let (best_2, limit_2) = bests.pop().context("the 2-commit limit")?;
    let (best_3, limit_3) = bests.pop().context("the 3-commit limit")?;
    limit(&format!("3 commits, batch {batch}, best at {best_3} consumers"), &limit_3);
    limit(&format!("2 commits, batch {batch}, best at {best_2} consumers"), &limit_2);
    let limit_async = if postgres {
        let l = drain_phase(&baseline, size, "server-side limit, async lease and ack", || {
            server_side_at(pools, n, consumers, batch, (false, true))
        })
        .await?;
        limit("3 commits, lease+ack async", &l);
        Some(l)
    } else {
        None
    };
    limit_pool.close().await;
    baseline.drop_server_side().await?;
    let limit_cpu = json!({
        "server_side_limit_3_commits": limit_3.backends_cpu_us_per_event,
        "server_side_limit_2_commits": limit_2.backends_cpu_us_per_event,
        "server_side_limit_3_commits_async_lease_ack": limit_async.and_then(|l| l.backends_cpu_us_per_event),
    });
    let (limit_async, limit_3, limit_2) =
        (limit_async.map(|l| l.events_per_s), limit_3.events_per_s, limit_2.events_per_s);

    let (client_sql, client_sql_same_batch, client_sql_locked) = if baseline.has_client_sql_baseline() {
        let at = |batch: i64| {
            let b = baseline.clone();
            timed(n, options.workers, move |t| {
                let b = b.clone();
                async move { Ok(b.client_sql_drain(t, batch).await?) }
            })
        };
        let rate = drain_phase(&baseline, size, "client-side SQL baseline", || at(CLIENT_SQL_BATCH)).await?;
        progress(&format!("client-side SQL, batch {CLIENT_SQL_BATCH:<4}                  {rate:>10.0} events/s"));
        let same_batch =
            drain_phase(&baseline, size, "client-side SQL baseline at haunt's batch size", || at(batch)).await?;
        progress(&format!("client-side SQL, batch {batch:<4}                  {same_batch:>10.0} events/s"));
        let b = baseline.clone();
        let locked = drain_phase(&baseline, size, "client-side SQL, locked", || {
            timed(n, options.workers, move |_| {
                let b = b.clone();
                async move { Ok(b.client_sql_locked_drain(CLIENT_SQL_BATCH).await?) }
            })
        })
        .await?;
        progress(&format!("client-side SQL, locked, one txn per batch  {locked:>10.0} events/s"));
        (Some(rate), Some(same_batch), Some(locked))
    } else {
        (None, None, None)
    };

    let s = store.clone();
    let pm = n.min(PER_MESSAGE_EVENTS_MAX);
    let per_message = drain_phase(&baseline, (pm, items), "per-message", || {
        timed(pm, lease_loops, move |_| per_message_drain(s.clone()))
    })
    .await?;
    progress(&format!("per-message (3 txn/event)                   {per_message:>10.0} events/s"));

    let haunt = drain_phase(&baseline, size, "haunt workers", || {
        haunt_drain(&options.db, options.workers, (options.batch_size, AckMode::Separate), n)
    })
    .await?;
    progress(&format!(
        "haunt workers (batch {:>4}, {} workers)       {haunt:>10.0} events/s: {:.2} of the 3-commit limit, \
         {:.2} of the 2-commit limit",
        options.batch_size,
        options.workers,
        haunt / limit_3,
        haunt / limit_2
    ));

    let haunt_ack_in_txn = drain_phase(&baseline, size, "haunt workers, ack in the apply's transaction", || {
        haunt_drain(&options.db, options.workers, (options.batch_size, AckMode::InApplyTxn), n)
    })
    .await?;
    progress(&format!(
        "haunt workers, ack in the apply's txn        {haunt_ack_in_txn:>10.0} events/s: {:.2} of the 2-commit limit",
        haunt_ack_in_txn / limit_2
    ));

    // A worker process of its own, at the batch size measured above: memory,
    // CPU, and what its connections cost the server.
    let process =
        drain_phase(&baseline, size, "worker process", || worker_process(&baseline, command, n, &store)).await?;
    progress(&format!(
        "haunt worker process, batch {:>4}, RUST_LOG={log}: {:.0} events/s ({:.2} of the 3-commit limit), \
         peak RSS {:.1} MiB, CPU {:.1} us/event, its server backends {:.1} us/event",
        options.batch_size,
        process.events_per_s,
        process.events_per_s / limit_3,
        process.peak_rss_mib.unwrap_or(f64::NAN),
        process.cpu_s.map_or(f64::NAN, |c| c * 1e6 / n as f64),
        process.backends_cpu_s.map_or(f64::NAN, |c| c * 1e6 / n as f64),
    ));

    let b = baseline.clone();
    let clients = options.clients;
    let raw_insert = timed(n, clients, move |c| {
        let b = b.clone();
        async move { Ok(b.raw_ingest(c, clients, n).await?) }
    })
    .await?;
    baseline.reset().await?;
    progress(&format!("raw insert txn ({clients} clients)                {raw_insert:>10.0} orders/s"));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/orders", listener.local_addr()?);
    let api_store =
        Store::connect(&options.db, StoreOptions { max_connections: 32, ..StoreOptions::default() }).await?;
    let server =
        tokio::spawn(haunt_api::run(listener, api_store, haunt_api::ApiConfig::default(), std::future::pending()));
    let http = reqwest::Client::builder().pool_max_idle_per_host(clients).build()?;
    let api = timed(n, clients, move |c| http_ingest(http.clone(), url.clone(), c, clients, n)).await?;
    server.abort();
    baseline.reset().await?;
    progress(&format!("API over HTTP ({clients} clients)                 {api:>10.0} orders/s"));

    let mut sweep = Vec::new();
    for &batch in &options.sweep_batch_sizes {
        for &workers in &options.sweep_workers {
            let rate = drain_phase(&baseline, size, "sweep", || {
                haunt_drain(&options.db, workers, (batch, AckMode::Separate), n)
            })
            .await?;
            progress(&format!("sweep: batch {batch:>4}, {workers} workers  {rate:>10.0} events/s"));
            sweep.push(json!({"batch_size": batch, "workers": workers, "events_per_s": rate}));
        }
    }

    report.insert("server_side_consumers".into(), json!(consumers));
    report.insert("server_side_consumers_best".into(), json!({"3 commits": best_3, "2 commits": best_2}));
    report.insert("server_side_limit_by_consumers".into(), serde_json::Value::Object(by_consumers));
    report.insert("lease_loops".into(), json!(lease_loops));
    report.insert("per_message_events".into(), json!(pm));
    report.insert(
        "events_per_s".into(),
        json!({
            "server_side_limit_3_commits": limit_3,
            "server_side_limit_2_commits": limit_2,
            "server_side_limit_3_commits_async_lease_ack": limit_async,
            "client_sql_baseline": client_sql,
            "client_sql_baseline_same_batch": client_sql_same_batch,
            "client_sql_locked_one_txn": client_sql_locked,
            "per_message": per_message,
            "haunt_workers": haunt,
            "haunt_workers_ack_in_txn": haunt_ack_in_txn,
            "worker_process": process.events_per_s,
        }),
    );
    report.insert("worker_process".into(), process.json(n, log));
    report.insert("postgres_backends_cpu_us_per_event".into(), limit_cpu);
    report.insert("worker_peak_rss_mib".into(), json!(process.peak_rss_mib));
    report.insert("orders_per_s".into(), json!({"raw_insert_txn": raw_insert, "api_http": api}));
    report.insert(
        "ratios".into(),
        json!({
            "haunt_vs_server_side_3_commits": haunt / limit_3,
            "haunt_vs_server_side_2_commits": haunt / limit_2,
            "haunt_vs_server_side_3_commits_async_lease_ack": limit_async.map(|r| haunt / r),
            "haunt_ack_in_txn_vs_server_side_2_commits": haunt_ack_in_txn / limit_2,
            "worker_process_vs_server_side_3_commits": process.events_per_s / limit_3,
            "haunt_vs_client_sql_baseline": client_sql.map(|r| haunt / r),
            "haunt_vs_client_sql_baseline_same_batch": client_sql_same_batch.map(|r| haunt / r),
            "haunt_vs_client_sql_locked_one_txn": client_sql_locked.map(|r| haunt / r),
            "haunt_vs_per_message": haunt / per_message,
            "api_vs_raw_insert": api / raw_insert,
        }),
    );
    if !sweep.is_empty() {
        report.insert("sweep".into(), json!(sweep));
    }
    baseline.close().await;
    store.close().await;
    Ok(serde_json::Value::Object(report))
}
