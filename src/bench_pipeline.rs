//! `haunt bench pipeline`: the worker and the API against what the database can
//! do, all measured in one run on one database.
//!
//! - the raw-SQL ceiling: the pipeline's protocol in hand-written batched SQL
//!   (lease 100, apply, delete: three statements), as a pgbench script would
//!   (PostgreSQL only: it reads the JSON payload in SQL); and beside it a
//!   lock-based variant with one transaction per batch and no lease;
//! - the per-message design of the tutorial: lease one, apply it, ack it, three
//!   transactions per event (haunt's store with batches of one);
//! - haunt's workers draining the same pre-enqueued events;
//! - API ingest over HTTP with C clients, against the raw two-statement insert
//!   transaction at the same concurrency.
//!
//! The database must be empty; the bench empties the pipeline's tables between
//! phases and at the end.
//!
//! The raw baselines and the resets are SQL on the pipeline's tables, so they
//! live in the store ([`haunt_store::Baseline`]); this file only calls them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use haunt_store::{Baseline, LeaseClock, Store, StoreOptions};
use serde_json::json;

#[derive(Debug, clap::Args)]
pub struct PipelineBench {
    /// The database: an empty one (postgres://… for every phase; sqlite://…
    /// leaves out the PostgreSQL-only raw ceiling).
    #[arg(long)]
    pub db: String,
    /// Events pre-enqueued for each drain phase, and orders sent for each ingest phase.
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    /// Worker processes' worth of consumers (each with its own connection pool).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Concurrent clients for the ingest phases.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Messages per batch for haunt's workers (their --batch-size-max).
    #[arg(long, default_value_t = 500)]
    pub batch_size: u32,
    /// Also drain with each of these batch sizes (comma-separated) for each
    /// count of --sweep-workers: the data of the throughput plot.
    #[arg(long, value_delimiter = ',', requires = "sweep_workers")]
    pub sweep_batch_sizes: Vec<u32>,
    /// The worker counts of the sweep (comma-separated).
    #[arg(long, value_delimiter = ',', requires = "sweep_batch_sizes")]
    pub sweep_workers: Vec<usize>,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

/// Messages per batch of the raw ceiling, as in the pgbench script.
const RAW_BATCH: i64 = 100;

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

async fn haunt_drain(db: &str, workers: usize, batch_size: u32, n: usize) -> anyhow::Result<f64> {
    let mut running = Vec::new();
    let started = Instant::now();
    for w in 0..workers {
        let store = Store::connect(db, StoreOptions::default()).await?;
        let config = haunt_worker::WorkerConfig {
            worker_id: format!("bench-{w}"),
            batch_size_max: batch_size,
            poll_interval: Duration::from_millis(5),
            ..haunt_worker::WorkerConfig::default()
        };
        let worker = haunt_worker::Worker::new(
            store,
            config,
            Arc::new(haunt_worker::Faults::default()),
            Arc::new(haunt_telemetry::metrics::WorkerMetrics::default()),
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        running.push((stop, tokio::spawn(async move { worker.run(stopped).await })));
    }
    let watcher = Store::connect(db, StoreOptions::default()).await?;
    wait_drained(&watcher, started, || Ok(())).await.with_context(|| format!("haunt's workers, {n} events"))?;
    let elapsed = started.elapsed().as_secs_f64();
    for (stop, task) in running {
        let _ = stop.send(true);
        let _ = task.await;
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
async fn wait_drained(
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

/// A `haunt worker` process (this executable) drains `n` pre-enqueued events
/// with batches of `batch_size`; returns its peak resident set in MiB (VmHWM,
/// read from /proc before it is stopped).
async fn worker_peak_rss_mib(db: &str, batch_size: u32, n: usize, watcher: &Store) -> anyhow::Result<f64> {
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .args(["worker", "--db", db, "--worker-id", "bench-memory", "--poll-interval-ms", "5"])
        .args(["--batch-size-max", &batch_size.to_string()])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting a haunt worker")?;
    let pid = child.id().context("the worker has no pid")?;
    wait_drained(watcher, Instant::now(), || match child.try_wait()? {
        Some(status) => anyhow::bail!("the worker exited with {status} before draining"),
        None => Ok(()),
    })
    .await
    .with_context(|| format!("a worker process, {n} events"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading the worker's /proc status")?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/PID/status")?;
    child.kill().await?;
    Ok(kib / 1024.0)
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

pub async fn pipeline(args: PipelineBench) -> anyhow::Result<()> {
    anyhow::ensure!(args.events > 0 && args.workers > 0 && args.clients > 0, "--events, --workers, --clients > 0");
    anyhow::ensure!(
        args.batch_size > 0 && !args.sweep_batch_sizes.contains(&0) && !args.sweep_workers.contains(&0),
        "batch sizes and worker counts must be positive"
    );
    let postgres = args.db.starts_with("postgres");
    // Opening it migrates it; it must hold nothing the bench would delete.
    let store = Store::connect(&args.db, StoreOptions { max_connections: 32, ..StoreOptions::default() })
        .await
        .with_context(|| format!("opening {}", args.db))?;
    anyhow::ensure!(store.is_empty().await?, "{} is not empty; the bench needs a database of its own", args.db);
    let baseline = Baseline::connect(&args.db, 32).await?;
    let n = args.events;
    let items = 64;
    let mut report = serde_json::Map::new();
    report.insert("machine".into(), json!(crate::bench::machine()));
    report.insert("db".into(), json!(if postgres { "postgres" } else { "sqlite" }));
    report.insert("events".into(), json!(n));
    report.insert("workers".into(), json!(args.workers));
    report.insert("clients".into(), json!(args.clients));
    report.insert("batch_size".into(), json!(args.batch_size));

    let size = (n, items);
    let (raw, raw_same_batch, raw_one_txn) = if baseline.has_raw_ceiling() {
        let raw_at = |batch: i64| {
            let b = baseline.clone();
            timed(n, args.workers, move |t| {
                let b = b.clone();
                async move { Ok(b.raw_drain(t, batch).await?) }
            })
        };
        let rate = drain_phase(&baseline, size, "raw ceiling", || raw_at(RAW_BATCH)).await?;
        eprintln!("raw lease/apply/delete (ceiling) {rate:>10.0} events/s");
        // The same protocol at haunt's batch size, for the like-for-like ratio.
        let same_batch =
            drain_phase(&baseline, size, "raw ceiling at haunt's batch size", || raw_at(i64::from(args.batch_size)))
                .await?;
        eprintln!("raw lease/apply/delete, batch {:<4} {same_batch:>8.0} events/s", args.batch_size);
        let b = baseline.clone();
        let one_txn = drain_phase(&baseline, size, "raw one transaction", || {
            timed(n, args.workers, move |_| {
                let b = b.clone();
                async move { Ok(b.raw_one_txn_drain(RAW_BATCH).await?) }
            })
        })
        .await?;
        eprintln!("raw locked, one txn per batch    {one_txn:>10.0} events/s");
        (Some(rate), Some(same_batch), Some(one_txn))
    } else {
        (None, None, None)
    };

    let s = store.clone();
    let per_message =
        drain_phase(&baseline, size, "per-message", || timed(n, args.workers, move |_| per_message_drain(s.clone())))
            .await?;
    eprintln!("per-message (3 txn/event)   {per_message:>10.0} events/s");

    let haunt =
        drain_phase(&baseline, size, "haunt workers", || haunt_drain(&args.db, args.workers, args.batch_size, n))
            .await?;
    eprintln!("haunt workers (batch {:>4})  {haunt:>10.0} events/s", args.batch_size);

    // Memory: a worker process of its own, at the batch size measured above.
    let rss_mib =
        drain_phase(&baseline, size, "worker memory", || worker_peak_rss_mib(&args.db, args.batch_size, n, &store))
            .await?;
    eprintln!("haunt worker process, batch {:>4}: peak RSS {rss_mib:.1} MiB", args.batch_size);

    let b = baseline.clone();
    let clients = args.clients;
    let raw_insert = timed(n, clients, move |c| {
        let b = b.clone();
        async move { Ok(b.raw_ingest(c, clients, n).await?) }
    })
    .await?;
    baseline.reset().await?;
    eprintln!("raw insert txn ({clients} clients) {raw_insert:>10.0} orders/s");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/orders", listener.local_addr()?);
    let api_store = Store::connect(&args.db, StoreOptions { max_connections: 32, ..StoreOptions::default() }).await?;
    let server =
        tokio::spawn(haunt_api::run(listener, api_store, haunt_api::ApiConfig::default(), std::future::pending()));
    let http = reqwest::Client::builder().pool_max_idle_per_host(clients).build()?;
    let api = timed(n, clients, move |c| http_ingest(http.clone(), url.clone(), c, clients, n)).await?;
    server.abort();
    baseline.reset().await?;
    eprintln!("API over HTTP ({clients} clients)  {api:>10.0} orders/s");

    let mut sweep = Vec::new();
    for &batch in &args.sweep_batch_sizes {
        for &workers in &args.sweep_workers {
            let rate = drain_phase(&baseline, size, "sweep", || haunt_drain(&args.db, workers, batch, n)).await?;
            eprintln!("sweep: batch {batch:>4}, {workers} workers  {rate:>10.0} events/s");
            sweep.push(json!({"batch_size": batch, "workers": workers, "events_per_s": rate}));
        }
    }

    report.insert(
        "events_per_s".into(),
        json!({
            "raw_ceiling": raw,
            "raw_ceiling_same_batch": raw_same_batch,
            "raw_one_txn": raw_one_txn,
            "per_message": per_message,
            "haunt_workers": haunt,
        }),
    );
    report.insert("worker_peak_rss_mib".into(), json!(rss_mib));
    report.insert("orders_per_s".into(), json!({"raw_insert_txn": raw_insert, "api_http": api}));
    report.insert(
        "ratios".into(),
        json!({
            "haunt_vs_raw_ceiling": raw.map(|r| haunt / r),
            "haunt_vs_raw_ceiling_same_batch": raw_same_batch.map(|r| haunt / r),
            "haunt_vs_raw_one_txn": raw_one_txn.map(|r| haunt / r),
            "haunt_vs_per_message": haunt / per_message,
            "api_vs_raw_insert": api / raw_insert,
        }),
    );
    if !sweep.is_empty() {
        report.insert("sweep".into(), json!(sweep));
    }
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(report))?;
    println!("{text}");
    if let Some(out) = &args.out {
        std::fs::write(out, format!("{text}\n")).with_context(|| format!("writing {}", out.display()))?;
    }
    baseline.close().await;
    store.close().await;
    Ok(())
}
