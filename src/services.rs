//! `haunt api`, `haunt worker`, `haunt relay`, `haunt reconcile`, `haunt redrive`: argument
//! structs and the few lines that start each service.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use haunt_store::{Bug, Store, StoreOptions};
use haunt_telemetry::logging::{self, LogFormat};

/// The embedded default: a SQLite file in the working directory.
pub const DEFAULT_DB: &str = "sqlite://haunt.db";

#[derive(Debug, clap::Args)]
pub struct DbArgs {
    /// Database URL: sqlite://PATH (embedded, the default) or postgres://USER@HOST:PORT/DB.
    #[arg(long, env = "HAUNT_DB", default_value = DEFAULT_DB)]
    pub db: haunt_store::DbUrl,
    /// Connections in each pool. `haunt worker` over the database queue opens
    /// its lease loops' before its first lease: two per loop in one pool (lease
    /// and ack) and one per loop in another (apply), at most this many each.
    #[arg(long, default_value_t = 8)]
    pub db_connections_max: u32,
}

#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Reintroduce a known mistake (see docs/bug-modes.md): no-inbox,
    /// inbox-outside-txn, ack-before-process, non-atomic-enqueue,
    /// read-modify-write-projection, worker-clock-lease, no-lease-token,
    /// new-event-id-on-retry, dlq-drop, async-commit; with a broker
    /// transport, relay-marks-before-publish and no-publisher-confirms; with
    /// one that keeps each key's order (sqs:fifo), retry-after-next.
    #[arg(long, value_name = "NAME")]
    pub bug: Option<Bug>,
    /// Log format: text or json.
    #[arg(long, default_value = "text")]
    pub log_format: LogFormat,
}

#[derive(Debug, clap::Args)]
pub struct ApiArgs {
    #[command(flatten)]
    pub service: ServiceArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
}

/// Where messages travel between the API and the workers.
#[derive(Debug, clap::Args)]
pub struct TransportArgs {
    /// The transport: db (the database queue, the default), or a broker with
    /// an optional mode: rabbitmq[:manual-ack|auto-ack], redis-streams,
    /// redis-pubsub, nats[:jetstream|core], mqtt[:qos0|qos1|qos2],
    /// sqs[:standard|fifo]. A broker name alone takes its at-least-once mode.
    /// With a broker the database queue is the outbox that `haunt relay`
    /// publishes from.
    #[arg(long, value_name = "NAME[:MODE]", default_value = "db", value_parser = haunt_transport::TransportSpec::built)]
    pub transport: haunt_transport::TransportSpec,
    /// The broker's URL (amqp://…, redis://…, nats://…, mqtt://…, http://…
    /// for SQS); required with a broker transport.
    #[arg(long, env = "HAUNT_BROKER")]
    pub broker: Option<String>,
}

impl TransportArgs {
    /// The broker's URL, when the transport has one; an error names the
    /// missing or needless flag.
    fn broker(&self) -> anyhow::Result<Option<String>> {
        match (self.transport.is_broker(), &self.broker) {
            (true, Some(url)) => Ok(Some(url.clone())),
            (true, None) => anyhow::bail!("--transport {} needs --broker URL", self.transport),
            (false, Some(_)) => anyhow::bail!("--broker is for a broker transport; --transport is db"),
            (false, None) => Ok(None),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub transport: TransportArgs,
    /// Names this worker in the ledger, logs and metrics (default: worker-PID).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// How long a lease hides a message from other workers.
    #[arg(long, default_value_t = 5_000)]
    pub visibility_timeout_ms: u64,
    /// Messages leased at once by one lease loop, applied in one transaction
    /// and acked in one statement (1: one transaction per message).
    #[arg(long, default_value_t = 500)]
    pub batch_size_max: u32,
    /// Deliveries a message gets before it is dead-lettered.
    #[arg(long, default_value_t = 10)]
    pub delivery_attempts_max: u32,
    /// How long an idle lease loop waits before asking again.
    #[arg(long, default_value_t = 50)]
    pub poll_interval_ms: u64,
    /// Lease loops running side by side.
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// Threads of the worker's async runtime (0: one per core). One serves
    /// the reference worker, whose lease loops spend their time waiting on
    /// the database or the broker (a few µs of its own CPU an event); on a
    /// small machine shared with the database, more threads spend theirs
    /// waking each other (docs/performance.md, "One runtime thread").
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Delete each applied batch's messages in the apply's own transaction
    /// instead of acking them after its commit: no ack can be lost, so the
    /// ack-loss fault has nothing to drop. Off by default: the separate ack is
    /// a broker's, and its loss is what the inbox is there to absorb.
    #[arg(long)]
    pub ack_in_txn: bool,
    /// How deliveries are traced: `batch` (the default), one span per batch
    /// linked to each message's producer, each delivery's span sent only when
    /// exporting (OTLP) and its line at debug; or `delivery`, a span and an
    /// info line per delivery, to read a worker's log one order at a time.
    /// Either way every delivery is in its order's trace.
    #[arg(long, default_value = "batch")]
    pub spans: haunt_worker::Spans,
    /// Serve /metrics, /healthz, /readyz (and /admin/faults and /admin/hold with HAUNT_ADMIN_TOKEN; see docs/admin.md) here.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Fault: the chance (0..=1) that an ack is dropped after the effect committed.
    #[arg(long, default_value_t = 0.0)]
    pub ack_fail_rate: f64,
    /// Fault: drop exactly the next N acks (on top of the rate), then ack normally.
    #[arg(long, default_value_t = 0)]
    pub ack_fail_next: u64,
    /// Fault: milliseconds added to this worker's clock.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub clock_offset_ms: i64,
}

#[derive(Debug, clap::Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub transport: TransportArgs,
    /// Names this relay in logs and to the broker (default: relay-PID).
    #[arg(long)]
    pub relay_id: Option<String>,
    /// How long a lease hides outbox rows from another relay; rows published
    /// and not deleted within it are published again.
    #[arg(long, default_value_t = 5_000)]
    pub visibility_timeout_ms: u64,
    /// Outbox rows published at once.
    #[arg(long, default_value_t = 500)]
    pub batch_size_max: u32,
    /// Serve /metrics and /healthz here.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Report the drift without fixing it.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RedriveArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Only this dead letter (default: all of them).
    #[arg(long)]
    pub message_id: Option<String>,
}

fn admin_token() -> Option<String> {
    std::env::var("HAUNT_ADMIN_TOKEN").ok().filter(|t| !t.is_empty())
}

/// Connects, retrying for a while: a service started during a database restart
/// should wait for it, not die. 30 s covers a crash recovery here.
async fn connect(db: &DbArgs, bug: Option<Bug>) -> anyhow::Result<Store> {
    const CONNECT_WAIT_MAX: Duration = Duration::from_secs(30);
    let options = StoreOptions { max_connections: db.db_connections_max, bug, ..StoreOptions::default() };
    let deadline = tokio::time::Instant::now() + CONNECT_WAIT_MAX;
    loop {
        match Store::connect(&db.db, options.clone()).await {
            Ok(store) => return Ok(store),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(anyhow::Error::new(e).context(format!("connecting to {}", db.db)));
            }
            Err(e) => {
                tracing::warn!(error = ?e, "database not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub async fn api(args: ApiArgs) -> anyhow::Result<()> {
    let telemetry = logging::init("haunt-api", args.service.log_format)?;
    let store = connect(&args.service.db, args.service.bug).await?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(listen = %listener.local_addr()?, db = %args.service.db.db, bug = ?args.service.bug, "api ready");
    let config = haunt_api::ApiConfig { admin_token: admin_token() };
    haunt_api::run(listener, store.clone(), config, Box::pin(shutdown_signal())).await.context("serving the api")?;
    store.close().await;
    telemetry.shutdown().await;
    Ok(())
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let telemetry = logging::init("haunt-worker", args.service.log_format)?;
    let worker_id = args.worker_id.unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let broker = args.transport.broker()?;
    anyhow::ensure!(
        !(broker.is_some() && args.ack_in_txn),
        "--ack-in-txn deletes from the database queue; with --transport {} the ack is the broker's",
        args.transport.transport
    );
    let config = haunt_worker::RunConfig {
        worker: haunt_worker::WorkerConfig {
            worker_id: worker_id.clone(),
            visibility_timeout: Duration::from_millis(args.visibility_timeout_ms),
            batch_size_max: args.batch_size_max.max(1),
            delivery_attempts_max: args.delivery_attempts_max.max(1),
            poll_interval: Duration::from_millis(args.poll_interval_ms),
            concurrency: args.concurrency.max(1),
            ack: if args.ack_in_txn { haunt_store::AckMode::InApplyTxn } else { haunt_store::AckMode::Separate },
            bug: args.service.bug,
            broker: broker.map(|url| haunt_worker::BrokerSource { spec: args.transport.transport, url }),
            spans: args.spans,
            ..haunt_worker::WorkerConfig::default()
        },
        faults: haunt_worker::faults::FaultSettings {
            ack_fail_rate: Some(args.ack_fail_rate),
            ack_fail_next: Some(args.ack_fail_next),
            clock_offset_ms: Some(args.clock_offset_ms),
            ..Default::default()
        },
        admin_token: admin_token(),
    };
    // Checked before connecting, so a bad flag fails at once.
    config.check().map_err(anyhow::Error::msg)?;
    let store = connect(&args.service.db, args.service.bug).await?;
    // The loops' connections open before the first lease, not in the first batches.
    if config.worker.broker.is_none() {
        store.warm_loops(config.worker.concurrency as u32).await.context("opening the lease loops' connections")?;
    }
    let listener = match args.metrics_listen {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?),
        None => None,
    };
    let runtime_threads = tokio::runtime::Handle::current().metrics().num_workers();
    tracing::info!(%worker_id, db = %args.service.db.db, transport = %args.transport.transport, bug = ?args.service.bug,
        runtime_threads, "worker ready");
    let ran = haunt_worker::run(listener, store.clone(), config, Box::pin(shutdown_signal())).await;
    store.close().await;
    telemetry.shutdown().await;
    Ok(ran?)
}

pub async fn relay(args: RelayArgs) -> anyhow::Result<()> {
    let telemetry = logging::init("haunt-relay", args.service.log_format)?;
    let Some(url) = args.transport.broker()? else {
        anyhow::bail!("haunt relay publishes to a broker: give --transport NAME and --broker URL");
    };
    let relay_id = args.relay_id.unwrap_or_else(|| format!("relay-{}", std::process::id()));
    let config = haunt_relay::RelayConfig {
        relay_id: relay_id.clone(),
        batch_size_max: args.batch_size_max.max(1),
        visibility_timeout: Duration::from_millis(args.visibility_timeout_ms.max(1)),
        bug: args.service.bug,
        ..haunt_relay::RelayConfig::new(args.transport.transport, url)
    };
    let store = connect(&args.service.db, args.service.bug).await?;
    let listener = match args.metrics_listen {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?),
        None => None,
    };
    tracing::info!(%relay_id, db = %args.service.db.db, transport = %args.transport.transport, "relay ready");
    let ran = haunt_relay::run(listener, store.clone(), config, Box::pin(shutdown_signal())).await;
    store.close().await;
    telemetry.shutdown().await;
    ran.context("serving the relay's metrics")
}

pub async fn reconcile(args: ReconcileArgs) -> anyhow::Result<()> {
    let store = connect(&args.db, None).await?;
    let report = store.reconcile(args.dry_run).await.context("reconciling")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        if report.drift.is_empty() {
            println!("projection: no drift");
        }
        for d in &report.drift {
            let verb = if args.dry_run { "would set" } else { "set" };
            println!(
                "drift: {} reserved_qty {} (expected {}, off by {:+}); {verb} to {}",
                d.item_id,
                d.reserved_qty,
                d.expected_qty,
                d.reserved_qty - d.expected_qty,
                d.expected_qty
            );
        }
        for order_id in &report.requeued {
            let verb = if args.dry_run { "would re-enqueue" } else { "re-enqueued" };
            println!("lost event: order {order_id} was never applied, queued or dead-lettered; {verb} it");
        }
    }
    store.close().await;
    Ok(())
}

pub async fn redrive(args: RedriveArgs) -> anyhow::Result<()> {
    let store = connect(&args.db, None).await?;
    let moved = store.redrive(args.message_id.as_deref()).await.context("redriving dead letters")?;
    println!("redrove {moved} dead letters back to the queue");
    store.close().await;
    Ok(())
}
