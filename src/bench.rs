//! `haunt bench`: the arguments of each benchmark and the call of its library
//! function in [`haunt_bench`], whose report is printed as JSON.

use std::path::{Path, PathBuf};

use anyhow::Context;

#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// The checker on a synthetic run of N client ops, against merely
    /// deserializing the same files with serde_json.
    Check(CheckBench),
    /// The harness's own ceiling: its clients and history recorder against a
    /// stub API that answers at once, against the same HTTP requests sent
    /// without recording.
    Harness(HarnessBench),
    /// The worker and the API against the database's ceiling, in one run: raw
    /// batched SQL, the per-message design (3 transactions per event), haunt's
    /// workers; API ingest against the raw insert transaction.
    Pipeline(PipelineBench),
    /// A broker transport's own speed: haunt's relay publishing a filled
    /// outbox and haunt's workers draining a filled broker (inbox, projection
    /// and ledger in one transaction, then the mode's ack), each paired with
    /// the transport's client doing the same without the database. The
    /// broker is started as a local process; PostgreSQL only.
    Transport(TransportBench),
}

#[derive(Debug, clap::Args)]
pub struct TransportBench {
    /// The transport and mode, as `haunt run --transport` spells it.
    #[arg(long, value_parser = haunt_transport::TransportSpec::built)]
    pub transport: haunt_transport::TransportSpec,
    /// An empty PostgreSQL database (postgres://…).
    #[arg(long)]
    pub db: haunt_store::DbUrl,
    /// Events of each phase [default: 20,000; 50,000 over Kafka, 2,000 over
    /// MQTT at QoS 1 and 2, 500 over SQS (moto): each phase outlasts what is
    /// fixed in it, and the slowest server ends in minutes].
    #[arg(long)]
    pub events: Option<usize>,
    /// Pairs of phases (bare, then haunt) run first and not counted, so that
    /// a broker's JIT and the database's caches are warm for the first round.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Messages per batch: the relay's and the workers' batch, and the bare client's.
    #[arg(long, default_value_t = 500)]
    pub batch_size: u32,
    /// haunt's consume loops, and the bare client's consumers.
    #[arg(long, default_value_t = 4)]
    pub consumers: usize,
    /// haunt's rounds, each between two of the bare client's.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// haunt's workers without the inbox (`--bug no-inbox`).
    #[arg(long)]
    pub no_inbox: bool,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct HarnessBench {
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Seconds each side runs.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
}

#[derive(Debug, clap::Args)]
pub struct CheckBench {
    /// Client ops in the synthetic history.
    #[arg(long, default_value_t = 1_000_000)]
    pub ops: u64,
    /// Where to write the synthetic run (default: a temporary directory, removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Concurrent client processes simulated in the history.
    #[arg(long, default_value_t = 64)]
    pub clients: u64,
}

#[derive(Debug, clap::Args)]
pub struct PipelineBench {
    /// The database: an empty one (postgres://… for every phase; sqlite://…
    /// leaves out the PostgreSQL-only client-side SQL baselines).
    #[arg(long)]
    pub db: haunt_store::DbUrl,
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
    /// RUST_LOG of the `haunt worker` process the bench starts: `warn` logs
    /// nothing but warnings; `info` (the worker's default) adds a line per
    /// delivery under --worker-spans delivery, none under `batch`; `debug`
    /// adds one per delivery under either.
    #[arg(long, default_value = "warn")]
    pub worker_rust_log: String,
    /// --spans of that `haunt worker` process: `batch` (one span per batch,
    /// the worker's default) or `delivery` (a span and a line per delivery;
    /// see `haunt worker --help`).
    #[arg(long, default_value = "batch", value_parser = ["delivery", "batch"])]
    pub worker_spans: String,
    /// Run only one phase: --events pre-enqueued, drained by a `haunt worker`
    /// process started under this command (split at spaces, the worker's own
    /// command line appended), e.g. "perf record -g -o worker.perf --". The
    /// command is sent SIGINT once the queue is empty, so that a profiler
    /// writes its data.
    #[arg(long)]
    pub profile_worker: Option<String>,
    /// Rounds of the paired measurement: the limit of haunt's default
    /// protocol (at its best consumer count) and haunt's default drain,
    /// alternately (limit, haunt, limit, …, limit), each drain against the
    /// mean of the limits just before and after it, so that the machine's
    /// drift during a run stays out of the ratio; then the same for
    /// `--ack-in-txn` and its two-commit protocol, and for the `haunt
    /// worker` processes. 0 leaves it out. Nine by default: on 2-core VMs
    /// single rounds ranged from 0.7 to 1.1, and the median of three moved
    /// by 0.2 between runs of the same build (docs/performance.md).
    #[arg(long, default_value_t = 9)]
    pub paired_rounds: usize,
    /// pgmq's SQL-only install (`pgmq-extension/sql/pgmq.sql` of
    /// github.com/pgmq/pgmq): pair haunt's default drain with a consumer over
    /// pgmq written as its documentation shows one (read a batch, one
    /// transaction for the effect, delete the batch), on the same server,
    /// batch and consumer count. PostgreSQL only; the bench installs it in
    /// the bench's database and drops it after.
    #[arg(long, value_name = "FILE")]
    pub pgmq_sql: Option<PathBuf>,
    /// Write the results as JSON here too.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

pub async fn harness(args: HarnessBench) -> anyhow::Result<()> {
    let options = haunt_bench::HarnessOptions {
        concurrency: args.concurrency,
        duration: std::time::Duration::from_secs(args.seconds),
    };
    print_report(&haunt_bench::harness(options).await?, None)
}

pub fn check(args: CheckBench) -> anyhow::Result<()> {
    let options = haunt_bench::CheckOptions { ops: args.ops, dir: args.dir, clients: args.clients };
    print_report(&haunt_bench::check(options, &mut |line| eprintln!("{line}"))?, None)
}

pub async fn pipeline(args: PipelineBench) -> anyhow::Result<()> {
    let options = haunt_bench::PipelineOptions {
        // The worker process is this very executable.
        haunt: std::env::current_exe().context("finding the haunt executable")?,
        db: args.db,
        events: args.events,
        workers: args.workers,
        clients: args.clients,
        batch_size: args.batch_size,
        sweep_batch_sizes: args.sweep_batch_sizes,
        sweep_workers: args.sweep_workers,
        worker_rust_log: args.worker_rust_log,
        worker_spans: args.worker_spans,
        profile_worker: args.profile_worker,
        paired_rounds: args.paired_rounds,
        pgmq_sql: args.pgmq_sql,
    };
    let report = haunt_bench::pipeline(options, &mut |line| eprintln!("{line}")).await?;
    print_report(&report, args.out.as_deref())
}

pub async fn transport(args: TransportBench) -> anyhow::Result<()> {
    let events = args.events.unwrap_or_else(|| haunt_bench::transport_default_events(args.transport));
    anyhow::ensure!(events > 0, "--events: at least 1");
    anyhow::ensure!(args.batch_size > 0, "--batch-size: at least 1");
    anyhow::ensure!(args.consumers > 0, "--consumers: at least 1");
    anyhow::ensure!(args.rounds > 0, "--rounds: at least 1");
    let options = haunt_bench::TransportOptions {
        spec: args.transport,
        db: args.db,
        events,
        batch_size: args.batch_size,
        consumers: args.consumers,
        rounds: args.rounds,
        warmup: args.warmup,
        no_inbox: args.no_inbox,
    };
    let report = haunt_bench::transport(options, &mut |line| eprintln!("{line}")).await?;
    print_report(&report, args.out.as_deref())
}

/// Prints a report as pretty JSON, and writes it to `out` too if given.
fn print_report(report: &serde_json::Value, out: Option<&Path>) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    println!("{text}");
    if let Some(out) = out {
        std::fs::write(out, format!("{text}\n")).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
