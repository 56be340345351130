//! What each bench runs: its options, and the one default the binary asks
//! for before it runs one. Compiled with or without the feature `run`, so
//! that the binary's arguments are the same in every build.

use std::path::PathBuf;
use std::time::Duration;

use haunt_store::DbUrl;
use haunt_transport::TransportSpec;

/// What the check bench runs.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Client ops in the synthetic history.
    pub ops: u64,
    /// Where to write the synthetic run; `None`: a temporary directory,
    /// removed after.
    pub dir: Option<PathBuf>,
    /// Concurrent client processes simulated in the history.
    pub clients: u64,
}

/// What the harness bench runs.
#[derive(Debug, Clone)]
pub struct HarnessOptions {
    /// Concurrent clients.
    pub concurrency: usize,
    /// How long each side runs (at least a second).
    pub duration: Duration,
}

/// What the pipeline bench runs.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// The `haunt` executable the worker process is started from.
    pub haunt: PathBuf,
    /// The database: an empty one (postgres://… for every phase; sqlite://…
    /// leaves out the PostgreSQL-only client-side SQL baselines).
    pub db: DbUrl,
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
    /// Its `--spans` (`delivery` or `batch`).
    pub worker_spans: String,
    /// Run only one phase: `events` pre-enqueued, drained by a `haunt worker`
    /// process started under this command (split at spaces, the worker's own
    /// command line appended). The command is sent SIGINT once the queue is
    /// empty, so that a profiler writes its data.
    pub profile_worker: Option<String>,
    /// Rounds of the paired measurement: the limit of haunt's default
    /// protocol and haunt's default drain measured alternately (limit,
    /// haunt, limit, … limit), each drain against the mean of the limits on
    /// either side of it. 0 leaves it out.
    pub paired_rounds: usize,
    /// pgmq's SQL-only install (`pgmq-extension/sql/pgmq.sql` of
    /// github.com/pgmq/pgmq): with it, haunt's default drain is paired with
    /// a client-side consumer over pgmq (PostgreSQL only).
    pub pgmq_sql: Option<PathBuf>,
}

/// What the transport bench runs.
#[derive(Debug, Clone)]
pub struct TransportOptions {
    pub spec: TransportSpec,
    /// An empty PostgreSQL database.
    pub db: DbUrl,
    /// Events of each phase.
    pub events: usize,
    /// Messages per batch: the relay's and the workers' `--batch-size-max`,
    /// and the bare client's batch.
    pub batch_size: u32,
    /// Consume loops (haunt's) and consumers (the bare client's).
    pub consumers: usize,
    /// haunt's phases; the bare ones are one more.
    pub rounds: usize,
    /// Pairs of phases (bare, haunt) run first and not counted.
    pub warmup: usize,
    /// haunt's drain without the inbox (`--bug no-inbox`): the row of
    /// `haunt guarantees` that leaves it out.
    pub no_inbox: bool,
}

/// The events of each phase when the user names none: enough that a
/// phase outlasts what is fixed in it (connecting, a consumer group's
/// assignment), few enough that the slowest server finishes in minutes.
pub fn default_events(spec: TransportSpec) -> usize {
    use haunt_transport::Kind;
    match spec.kind {
        // moto answers every call in Python, slower as its queue grows:
        // 500 messages publish at about 180/s and drain at about 60/s, and
        // 10,000 did not publish within the phase's ten minutes.
        Kind::Sqs => 500,
        // mosquitto, as a run configures it, saves its store on every
        // change: about 700 publishes/s at QoS 1 and 2 (2026-12-06).
        Kind::Mqtt if spec.keeps_for_absent_consumers() => 2_000,
        // A drain of 10,000 took 0.1 s bare, less than the consumer group
        // takes to give each member its partitions (two heartbeats, 1 s).
        Kind::Kafka => 50_000,
        _ => 20_000,
    }
}
