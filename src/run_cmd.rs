//! `haunt run`: arguments and the exit status.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use haunt_chaos::core::fault::Fault;
use haunt_chaos::core::run::{BackendKind, DockerOptions, RunOptions};
use haunt_store::Bug;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum BackendArg {
    /// Child processes of this harness (SQLite by default, or --db).
    Local,
    /// Containers: PostgreSQL, the API and the workers on a private network
    /// (images from scripts/images).
    Docker,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum AimArg {
    Points,
    Client,
    Blind,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Run with every option as FILE gives it, a JSON object in the form of
    /// `run.json`'s `options` (or a whole `run.json`, to run a recorded run
    /// again with its seed): no other flag may be given. The services run
    /// from this executable, and the new run records this build's revision.
    #[arg(long, value_name = "FILE", exclusive = true)]
    pub options: Option<PathBuf>,
    /// Where the pipeline runs.
    #[arg(long, value_enum, default_value = "local")]
    pub backend: BackendArg,
    /// --backend docker: the services' image.
    #[arg(long, default_value = "haunt:latest")]
    pub image: String,
    /// --backend docker: the PostgreSQL image.
    #[arg(long, default_value = "haunt-postgres:latest")]
    pub postgres_image: String,
    /// --backend docker with --transport: the brokers' image (docker/brokers).
    #[arg(long, default_value = "haunt-brokers:latest")]
    pub brokers_image: String,
    /// --backend docker: run the image's own `haunt` instead of mounting this
    /// executable into the containers.
    #[arg(long)]
    pub image_binary: bool,
    /// How long the workload runs, in seconds. It must fit each enabled fault
    /// once, with its calm and hold (see --skip-fit-check).
    #[arg(long, default_value_t = 60)]
    pub time_limit_s: u64,
    /// Target client ops per second, across all clients.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Database URL; default: a fresh SQLite file in the run directory.
    /// postgres://USER@HOST:PORT/DB runs against a real server.
    #[arg(long)]
    pub db: Option<haunt_store::DbUrl>,
    /// Faults, comma-separated: kill, pause, partition, delay, ack-loss,
    /// clock-skew, db-error, stall (a worker stalls past its lease right after
    /// leasing), db-restart (needs --pg-data or --backend docker), loss
    /// (--backend docker), broker-restart and relay-kill (need --transport);
    /// or all, or none. Default: the first seven, and with a broker
    /// relay-kill and (where its server keeps data through a restart)
    /// broker-restart; with --system, all that the file allows.
    #[arg(long)]
    pub nemesis: Option<String>,
    /// Strike these fault windows instead of the seeded schedule: a run's
    /// `schedule.json` (its faults, targets, starts and holds, in order;
    /// docs/run-format.md). The seed still drives the workload. The faults are
    /// the ones it names, so --nemesis cannot be given with it.
    #[arg(long, value_name = "FILE", conflicts_with = "nemesis")]
    pub schedule: Option<PathBuf>,
    /// Run the system this file describes (docs/system-format.md) instead of
    /// haunt's reference pipeline: its nodes, its client, its final-state SQL.
    #[arg(long, value_name = "FILE")]
    pub system: Option<PathBuf>,
    /// How a kill or a pause finds work in flight: at a hold point where the
    /// node offers one (haunt's workers, a system file's `points`), else,
    /// for a node the client calls, while a request is in flight there
    /// (points, the default); from the client's side only (client); or
    /// never (blind). Every other strike of a kind is aimed either way.
    #[arg(long, value_enum, default_value = "points")]
    pub aim: AimArg,
    /// With --system: which of the file's [[variant]]s to run (default: its
    /// first). Each fills the file's {var:NAME} its own way.
    #[arg(long, value_name = "NAME", requires = "system")]
    pub variant: Option<String>,
    /// Mean seconds between faults (each also lasts about this long). The
    /// first round, every enabled fault once in a seeded order, is shortened
    /// to fit the time limit; faults are picked at random after it.
    #[arg(long, default_value_t = 5.0)]
    pub nemesis_interval_s: f64,
    /// Start even when the time limit cannot fit every enabled fault once; the
    /// faults that never fired are named after the run.
    #[arg(long)]
    pub skip_fit_check: bool,
    /// Seed of the workload and the fault schedule (default: random, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where run directories go.
    #[arg(long, default_value = "store")]
    pub store: PathBuf,
    /// Workers' visibility timeout; pauses last at least twice this.
    #[arg(long, default_value_t = 2_000)]
    pub visibility_timeout_ms: u64,
    /// Fault schedules running side by side, each over its share of the
    /// --nemesis kinds, so that faults of different kinds overlap.
    #[arg(long, default_value_t = 1)]
    pub faults_at_once: usize,
    /// Deliveries a message gets before the workers dead-letter it.
    #[arg(long, default_value_t = 10)]
    pub delivery_attempts_max: u32,
    /// The chance that a worker drops an ack after the effect committed, for
    /// the whole run (a lossy broker), on top of the ack-loss fault's windows.
    #[arg(long, default_value_t = 0.0, value_name = "RATE")]
    pub ack_fail_rate: f64,
    /// The workers delete each batch's messages in the apply's own
    /// transaction (`haunt worker --ack-in-txn`), so no ack can be lost and
    /// `ack-loss` has nothing to drop. Off by default: a broker's separate ack,
    /// and its loss, is what haunt exists to show.
    #[arg(long)]
    pub ack_in_txn: bool,
    /// Narrow the faults that can hit any of these targets to them, e.g.
    /// `client<->api` (delay and partition then spare the database links);
    /// other faults keep their own targets. Comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "TARGET")]
    pub fault_targets: Vec<String>,
    /// How long to wait for the queue to drain after healing.
    #[arg(long, default_value_t = 60)]
    pub quiesce_timeout_s: u64,
    /// Run the services with a known mistake switched on (see `haunt api --help`).
    #[arg(long, value_name = "NAME")]
    pub bug: Option<Bug>,
    /// Where messages travel: db (the database queue, the default), or a
    /// broker the run starts as a local process, with a relay publishing the
    /// outbox to it: rabbitmq[:manual-ack|auto-ack], redis-streams,
    /// redis-pubsub, nats[:jetstream|core], mqtt[:qos0|qos1|qos2],
    /// sqs[:standard|fifo], pubsub[:pull|exactly-once|ordered],
    /// kafka[:at-least-once|at-most-once|eos|acks-1]. A name alone takes its
    /// at-least-once mode. The broker, its links and the relay take faults
    /// too (see --nemesis). `haunt guarantees --help` says what each claims.
    #[arg(long, value_name = "NAME[:MODE]", default_value = "db", value_parser = haunt_transport::TransportSpec::built)]
    pub transport: haunt_transport::TransportSpec,
    /// Client request timeout; a request without an answer by then is indeterminate.
    #[arg(long, default_value_t = 2_000)]
    pub request_timeout_ms: u64,
    /// Distinct items ordered: few on purpose, so rows are hot.
    #[arg(long, default_value_t = 5)]
    pub items: usize,
    /// Keys (items named key-0, key-1, …) that each belong to one client,
    /// which orders them in turn: each key's orders form a chain fixed in
    /// real time, for the order check (results.json's `order`). Key k
    /// belongs to client k mod --concurrency; clients left without a key
    /// order the --items as usual.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub ordered_keys: usize,
    /// With --transport kafka: 1 broker, or a cluster of 3 (KRaft, each
    /// node broker and controller; replication factor 3,
    /// min.insync.replicas 2). A cluster's links can be cut between brokers
    /// (broker-1<->broker-2, broker-1<->brokers) and around a node
    /// (broker-1<->all: its peers and its clients), and broker-restart and
    /// pause take one node at a time.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub kafka_brokers: usize,
    /// With --transport kafka: the server behind it. kafka is Apache
    /// Kafka's own broker; tansu is a Kafka-compatible broker on SQLite
    /// (one node; its consumers join the classic way; no transactions, so
    /// not kafka:eos; local backend only), installed by
    /// `HAUNT_BROKERS=tansu scripts/brokers`. Its clients share one proxy:
    /// its link is clients<->broker.
    #[arg(long, value_name = "SERVER", default_value = "kafka")]
    pub kafka_server: haunt_chaos::core::options::KafkaServer,
    /// The data directory of the PostgreSQL server behind --db, which the
    /// harness may kill and restart (needed by --nemesis db-restart).
    #[arg(long, value_name = "DIR")]
    pub pg_data: Option<PathBuf>,
    /// Serve the harness's metrics (haunt_fault_active, haunt_client_ops_total,
    /// haunt_client_op_duration_seconds, haunt_check_valid, haunt_check_anomalies)
    /// at /metrics on this address while the run lasts.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// With --metrics-listen: keep serving this many seconds after the verdict,
    /// so a scraper sees the check's result.
    #[arg(long, default_value_t = 0)]
    pub metrics_linger_s: u64,
    /// Write this run's scrape targets (API, workers, and the harness with
    /// --metrics-listen) to FILE for Prometheus's file_sd_configs.
    #[arg(long, value_name = "FILE")]
    pub prometheus_sd: Option<PathBuf>,
    /// Print nothing but the verdict line.
    #[arg(long)]
    pub quiet: bool,
}

pub fn revision() -> &'static str {
    option_env!("HAUNT_GIT_REVISION").unwrap_or("unknown")
}

pub async fn run(args: RunArgs) -> anyhow::Result<i32> {
    // The faults as the user named them: a file names them all (an empty
    // list is `none`), flags may leave them to the system's defaults.
    let (mut options, nemesis) = match &args.options {
        Some(file) => {
            let options = options_from_file(file)?;
            let named = options.faults.iter().map(|f| f.name()).collect::<Vec<_>>().join(",");
            (options, Some(named))
        }
        None => {
            let schedule = args.schedule.as_deref().map(haunt_chaos::core::nemesis::ScheduleFile::read).transpose()?;
            let nemesis = match &schedule {
                Some(s) => Some(s.faults().iter().map(|f| f.name()).collect::<Vec<_>>().join(",")),
                None => args.nemesis.clone(),
            };
            let mut options = options_from_flags(args)?;
            options.schedule = schedule;
            (options, nemesis)
        }
    };
    // `all` depends on the rest: db-restart with a database node, loss in containers.
    let target = haunt_chaos::assemble::Target::of(&options)?;
    let faults = nemesis.as_deref().map(|list| Fault::parse_list(list, &target.all_faults(&options))).transpose()?;
    target.complete(&mut options, faults);
    // Every other check is the run's own (`Target::check`), before it creates
    // anything; Ctrl-C heals and stops it (`haunt_chaos::interrupt`).
    let (quiet, seed) = (options.quiet, options.seed);
    let outcome = haunt_chaos::assemble::run_interruptible(target, &options).await?;
    if outcome.aborted {
        eprintln!("aborted: {}", outcome.run_dir.display());
        return Ok(haunt_chaos::interrupt::EXIT_INTERRUPTED);
    }
    let results = outcome.results.context("a finished run has results")?;
    // A failing run can be shrunk to a smaller one that fails the same way.
    let shrink = (results.valid != haunt_checker::Verdict::Valid)
        .then(|| format!("shrink: haunt shrink {}", outcome.run_dir.display()));
    if quiet {
        println!("{} {}", results.valid.as_str(), outcome.run_dir.display());
        // The one line on stdout stays the verdict's.
        for warning in outcome.warnings.iter().chain(&shrink) {
            eprintln!("{warning}");
        }
    } else {
        print!("{}", haunt_checker::summary::render(&results));
        for warning in &outcome.warnings {
            println!("{warning}");
        }
        println!("\nrun: {}", outcome.run_dir.display());
        println!("report: {}", outcome.run_dir.join("report.html").display());
        println!("seed: {seed} (replay with --seed {seed})");
        if let Some(shrink) = &shrink {
            println!("{shrink}");
        }
    }
    Ok(results.valid.exit_code())
}

/// The options the flags give.
fn options_from_flags(args: RunArgs) -> anyhow::Result<RunOptions> {
    let seed = args.seed.unwrap_or_else(|| haunt_chaos::core::seed::RunSeed::random().0);
    Ok(RunOptions {
        backend: match args.backend {
            BackendArg::Local => BackendKind::Local,
            BackendArg::Docker => BackendKind::Docker,
        },
        docker: DockerOptions {
            image: args.image,
            postgres_image: args.postgres_image,
            brokers_image: args.brokers_image,
            mount_exe: !args.image_binary,
        },
        time_limit: Duration::from_secs(args.time_limit_s),
        rate: args.rate,
        concurrency: args.concurrency,
        workers: args.workers,
        db: args.db,
        system: args.system,
        variant: args.variant,
        aim: match args.aim {
            AimArg::Points => haunt_chaos::core::options::Aiming::Points,
            AimArg::Client => haunt_chaos::core::options::Aiming::Client,
            AimArg::Blind => haunt_chaos::core::options::Aiming::Blind,
        },
        faults: Vec::new(),
        nemesis_interval: Duration::try_from_secs_f64(args.nemesis_interval_s).unwrap_or_default(),
        seed,
        store: args.store,
        visibility_timeout: Duration::from_millis(args.visibility_timeout_ms),
        quiesce_timeout: Duration::from_secs(args.quiesce_timeout_s),
        delivery_attempts_max: args.delivery_attempts_max,
        ack_fail_rate: args.ack_fail_rate,
        ack_in_txn: args.ack_in_txn,
        fault_targets: args.fault_targets,
        faults_at_once: args.faults_at_once,
        fit_check: !args.skip_fit_check,
        metrics_listen: args.metrics_listen,
        metrics_linger: Duration::from_secs(args.metrics_linger_s),
        prometheus_sd: args.prometheus_sd,
        bug: args.bug,
        transport: args.transport,
        quiet: args.quiet,
        request_timeout: Duration::from_millis(args.request_timeout_ms),
        items: args.items,
        ordered_keys: args.ordered_keys,
        kafka_brokers: args.kafka_brokers,
        kafka_server: args.kafka_server,
        schedule: None,
        exe: std::env::current_exe().context("finding the haunt executable")?,
        git_revision: revision().to_owned(),
        pg_data: args.pg_data,
    })
}

/// The options a file gives (`--options`): a `run.json`'s `options`, or a
/// whole `run.json`. The executable and the revision are this process's.
fn options_from_file(file: &std::path::Path) -> anyhow::Result<RunOptions> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", file.display()))?;
    // A whole `run.json` has the options beside the seed and the verdict.
    if value.get("haunt_version").is_some() {
        value = value["options"].take();
    }
    let mut options: RunOptions =
        serde_json::from_value(value).with_context(|| format!("{}: not a run's options", file.display()))?;
    options.exe = std::env::current_exe().context("finding the haunt executable")?;
    options.git_revision = revision().to_owned();
    Ok(options)
}
