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

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use haunt_store::{LeaseClock, Store, StoreOptions};
use serde_json::json;
use sqlx::AnyPool;

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

/// Rows per multi-row insert while pre-enqueuing.
const ENQUEUE_CHUNK: usize = 500;
/// Messages per batch of the raw ceiling, as in the pgbench script.
const RAW_BATCH: i64 = 100;

const TABLES: [&str; 6] =
    ["orders", "queue_messages", "inbox_processed", "inventory_projection", "projection_ledger", "dead_letters"];

/// Empties the pipeline's tables. On PostgreSQL by TRUNCATE, so that no phase
/// pays for the dead rows of the one before it.
async fn reset(pool: &AnyPool, postgres: bool) -> anyhow::Result<()> {
    if postgres {
        let sql = format!("TRUNCATE {}", TABLES.join(", "));
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await?;
        return Ok(());
    }
    for table in TABLES {
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}"))).execute(pool).await?;
    }
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Writes `n` orders and their messages, visible at once, as the API would have.
async fn enqueue(pool: &AnyPool, n: usize, items: usize) -> anyhow::Result<()> {
    // A second in the past: visible whatever the small skew between clocks.
    let at = now_ms() - 1_000;
    for start in (0..n).step_by(ENQUEUE_CHUNK) {
        let rows = ENQUEUE_CHUNK.min(n - start);
        let mut tx = pool.begin().await?;
        let orders = format!(
            "INSERT INTO orders (order_id, item_id, qty, event_id, correlation_id, created_at_ms) VALUES {}",
            haunt_store::sql_values(1, rows, 6, "")
        );
        let messages = format!(
            "INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, visible_at_ms) \
             VALUES {}",
            haunt_store::sql_values(1, rows, 6, "")
        );
        let mut o = sqlx::query(sqlx::AssertSqlSafe(orders));
        let mut m = sqlx::query(sqlx::AssertSqlSafe(messages));
        for i in start..start + rows {
            let (order_id, event_id, item_id) = (format!("b-{i}"), format!("e-{i}"), format!("item-{}", i % items));
            let payload = json!({"event_id": event_id, "order_id": order_id, "item_id": item_id, "qty": 1});
            let headers = json!({"correlation_id": order_id});
            o = o.bind(order_id.clone()).bind(item_id).bind(1i64).bind(event_id.clone()).bind(order_id).bind(at);
            m = m
                .bind(format!("m-{i}"))
                .bind(event_id)
                .bind(payload.to_string())
                .bind(headers.to_string())
                .bind(at)
                .bind(at);
        }
        o.execute(&mut *tx).await?;
        m.execute(&mut *tx).await?;
        tx.commit().await?;
    }
    Ok(())
}

async fn count(pool: &AnyPool, sql: &'static str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await?)
}

/// Every event applied once, the queue empty: a phase that cheated would show.
async fn verify_drained(pool: &AnyPool, n: usize, phase: &str) -> anyhow::Result<()> {
    let queued = count(pool, "SELECT CAST(COUNT(*) AS BIGINT) FROM queue_messages").await?;
    let applied = count(pool, "SELECT CAST(COUNT(DISTINCT event_id) AS BIGINT) FROM projection_ledger").await?;
    let rows = count(pool, "SELECT CAST(COUNT(*) AS BIGINT) FROM projection_ledger").await?;
    let total = count(pool, "SELECT CAST(COALESCE(SUM(reserved_qty), 0) AS BIGINT) FROM inventory_projection").await?;
    anyhow::ensure!(
        queued == 0 && applied == n as i64 && rows == n as i64 && total == n as i64,
        "{phase}: {queued} still queued, {applied} events applied in {rows} ledger rows, projection {total} (of {n})"
    );
    Ok(())
}

// The ceiling: the pipeline's protocol in hand-written SQL, a batch of 100 at a
// time: lease (a committed lease token and visibility timeout, so that a crash
// hands the batch on), apply (one statement, fenced by the token), delete.

const RAW_LEASE: &str = "UPDATE queue_messages SET delivery_count = delivery_count + 1, lease_token = $2, \
     lease_until_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + 30000, \
     visible_at_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + 30000 \
     WHERE message_id IN (SELECT message_id FROM queue_messages \
       WHERE visible_at_ms <= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) \
       ORDER BY visible_at_ms LIMIT $1 FOR UPDATE SKIP LOCKED) \
     RETURNING message_id";
/// The apply of both raw variants: `m` names the batch's messages (event id
/// and parsed payload). The inbox insert goes in event order and the projection
/// upsert in item order, as haunt's batches do, so two batches never deadlock.
macro_rules! raw_apply {
    ($m:literal) => {
        concat!(
            "WITH m AS (", $m, "), ",
            "fresh AS (INSERT INTO inbox_processed (event_id, processed_at_ms) SELECT event_id, 0 FROM m ",
            "ORDER BY event_id ON CONFLICT DO NOTHING RETURNING event_id), ",
            "agg AS (INSERT INTO inventory_projection (item_id, reserved_qty) ",
            "SELECT m.p->>'item_id', SUM(CAST(m.p->>'qty' AS BIGINT)) FROM m JOIN fresh USING (event_id) ",
            "GROUP BY 1 ORDER BY 1 ",
            "ON CONFLICT (item_id) DO UPDATE SET reserved_qty = inventory_projection.reserved_qty + excluded.reserved_qty) ",
            "INSERT INTO projection_ledger (event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms) ",
            "SELECT m.event_id, m.p->>'order_id', m.p->>'item_id', CAST(m.p->>'qty' AS BIGINT), 1, 'raw', 0 ",
            "FROM m JOIN fresh USING (event_id)"
        )
    };
}

/// Fenced by the lease token ($1) over the leased ids ($2).
const RAW_APPLY_LEASED: &str = raw_apply!(
    "SELECT event_id, CAST(payload AS json) AS p FROM queue_messages \
     WHERE message_id = ANY(string_to_array($2, ',')) AND lease_token = $1 FOR UPDATE"
);
const RAW_ACK: &str =
    "DELETE FROM queue_messages WHERE lease_token = $1 AND message_id = ANY(string_to_array($2, ','))";

async fn raw_drain(pool: AnyPool, task: usize, batch_size: i64) -> anyhow::Result<()> {
    for batch in 0.. {
        let token = format!("raw-{task}-{batch}");
        let ids: Vec<String> = sqlx::query_scalar(RAW_LEASE).bind(batch_size).bind(&token).fetch_all(&pool).await?;
        if ids.is_empty() {
            break;
        }
        let list = ids.join(",");
        sqlx::query(RAW_APPLY_LEASED).bind(&token).bind(&list).execute(&pool).await?;
        sqlx::query(RAW_ACK).bind(&token).bind(&list).execute(&pool).await?;
    }
    Ok(())
}

// A stronger baseline, shown beside it: no lease at all, the batch's rows locked
// (FOR UPDATE SKIP LOCKED) from the read to the delete in one transaction. One
// commit per batch instead of three, but a consumer that holds row locks while
// it works, which is not the visibility-timeout protocol haunt tests.

const RAW_LOCK: &str = "SELECT message_id, event_id, payload FROM queue_messages \
     WHERE visible_at_ms <= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) \
     ORDER BY visible_at_ms LIMIT $1 FOR UPDATE SKIP LOCKED";
const RAW_APPLY: &str = raw_apply!(
    "SELECT event_id, CAST(payload AS json) AS p FROM queue_messages \
     WHERE message_id IN (SELECT unnest(string_to_array($1, ',')))"
);
const RAW_DELETE: &str = "DELETE FROM queue_messages WHERE message_id IN (SELECT unnest(string_to_array($1, ',')))";

async fn raw_one_txn_drain(pool: AnyPool) -> anyhow::Result<()> {
    loop {
        let mut tx = pool.begin().await?;
        let ids: Vec<String> = sqlx::query_scalar(RAW_LOCK).bind(RAW_BATCH).fetch_all(&mut *tx).await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(());
        }
        let list = ids.join(",");
        sqlx::query(RAW_APPLY).bind(&list).execute(&mut *tx).await?;
        sqlx::query(RAW_DELETE).bind(&list).execute(&mut *tx).await?;
        tx.commit().await?;
    }
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
    pool: &AnyPool,
    postgres: bool,
    (n, items): (usize, usize),
    phase: &str,
    measure: impl FnOnce() -> Fut,
) -> anyhow::Result<T>
where
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    enqueue(pool, n, items).await?;
    let value = measure().await?;
    verify_drained(pool, n, phase).await?;
    reset(pool, postgres).await?;
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

/// The raw insert transaction the API's commit amounts to.
async fn raw_ingest(pool: AnyPool, client: usize, clients: usize, n: usize) -> anyhow::Result<()> {
    for i in (client..n).step_by(clients) {
        let (order_id, event_id) = (format!("r-{i}"), format!("re-{i}"));
        let payload = json!({"event_id": event_id, "order_id": order_id, "item_id": "item-0", "qty": 1}).to_string();
        let headers = json!({"correlation_id": order_id}).to_string();
        let at = now_ms();
        let mut tx = pool.begin().await?;
        sqlx::query(
            "INSERT INTO orders (order_id, item_id, qty, event_id, correlation_id, created_at_ms) \
             VALUES ($1, 'item-0', 1, $2, $1, $3)",
        )
        .bind(&order_id)
        .bind(&event_id)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, visible_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $5)",
        )
        .bind(format!("rm-{i}"))
        .bind(&event_id)
        .bind(payload)
        .bind(headers)
        .bind(at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
    }
    Ok(())
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
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new().max_connections(32).connect(&args.db).await?;
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
    let (raw, raw_same_batch, raw_one_txn) = if postgres {
        let raw_at = |batch: i64| {
            let p = pool.clone();
            timed(n, args.workers, move |t| raw_drain(p.clone(), t, batch))
        };
        let rate = drain_phase(&pool, postgres, size, "raw ceiling", || raw_at(RAW_BATCH)).await?;
        eprintln!("raw lease/apply/delete (ceiling) {rate:>10.0} events/s");
        // The same protocol at haunt's batch size, for the like-for-like ratio.
        let same_batch = drain_phase(&pool, postgres, size, "raw ceiling at haunt's batch size", || {
            raw_at(i64::from(args.batch_size))
        })
        .await?;
        eprintln!("raw lease/apply/delete, batch {:<4} {same_batch:>8.0} events/s", args.batch_size);
        let p = pool.clone();
        let one_txn = drain_phase(&pool, postgres, size, "raw one transaction", || {
            timed(n, args.workers, move |_| raw_one_txn_drain(p.clone()))
        })
        .await?;
        eprintln!("raw locked, one txn per batch    {one_txn:>10.0} events/s");
        (Some(rate), Some(same_batch), Some(one_txn))
    } else {
        (None, None, None)
    };

    let s = store.clone();
    let per_message = drain_phase(&pool, postgres, size, "per-message", || {
        timed(n, args.workers, move |_| per_message_drain(s.clone()))
    })
    .await?;
    eprintln!("per-message (3 txn/event)   {per_message:>10.0} events/s");

    let haunt =
        drain_phase(&pool, postgres, size, "haunt workers", || haunt_drain(&args.db, args.workers, args.batch_size, n))
            .await?;
    eprintln!("haunt workers (batch {:>4})  {haunt:>10.0} events/s", args.batch_size);

    // Memory: a worker process of its own, at the batch size measured above.
    let rss_mib = drain_phase(&pool, postgres, size, "worker memory", || {
        worker_peak_rss_mib(&args.db, args.batch_size, n, &store)
    })
    .await?;
    eprintln!("haunt worker process, batch {:>4}: peak RSS {rss_mib:.1} MiB", args.batch_size);

    let p = pool.clone();
    let clients = args.clients;
    let raw_insert = timed(n, clients, move |c| raw_ingest(p.clone(), c, clients, n)).await?;
    reset(&pool, postgres).await?;
    eprintln!("raw insert txn ({clients} clients) {raw_insert:>10.0} orders/s");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/orders", listener.local_addr()?);
    let api_store = Store::connect(&args.db, StoreOptions { max_connections: 32, ..StoreOptions::default() }).await?;
    let server =
        tokio::spawn(haunt_api::run(listener, api_store, haunt_api::ApiConfig::default(), std::future::pending()));
    let http = reqwest::Client::builder().pool_max_idle_per_host(clients).build()?;
    let api = timed(n, clients, move |c| http_ingest(http.clone(), url.clone(), c, clients, n)).await?;
    server.abort();
    reset(&pool, postgres).await?;
    eprintln!("API over HTTP ({clients} clients)  {api:>10.0} orders/s");

    let mut sweep = Vec::new();
    for &batch in &args.sweep_batch_sizes {
        for &workers in &args.sweep_workers {
            let rate = drain_phase(&pool, postgres, size, "sweep", || haunt_drain(&args.db, workers, batch, n)).await?;
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
    pool.close().await;
    store.close().await;
    Ok(())
}
