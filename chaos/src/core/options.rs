//! A run's options, typed and checked once ([`RunOptions::validate`]) before
//! anything exists, so that a refused run leaves nothing behind.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use haunt_store::{Bug, DbKind, DbUrl};
use haunt_transport::{OrderClaim, TransportSpec};
use serde::{Deserialize, Serialize};

use crate::core::fault::{Fault, FaultSettings};
use crate::core::nemesis::ACT_ALLOWANCE;

/// Where the pipeline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Child processes of the harness, over SQLite or a PostgreSQL server given by URL.
    #[default]
    Local,
    /// Containers on a private network, with a PostgreSQL container of their own.
    Docker,
}

/// The server behind `--transport kafka`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum KafkaServer {
    /// Apache Kafka's own broker (one node, or a cluster of three).
    #[default]
    Kafka,
    /// tansu, a Kafka-compatible broker in Rust on SQLite: one node, the
    /// classic group protocol, no transactions. Optional: built by
    /// `HAUNT_BROKERS=tansu scripts/brokers`.
    Tansu,
}

impl KafkaServer {
    pub fn name(self) -> &'static str {
        match self {
            KafkaServer::Kafka => "kafka",
            KafkaServer::Tansu => "tansu",
        }
    }
}

impl std::fmt::Display for KafkaServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KafkaServer {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kafka" => Ok(KafkaServer::Kafka),
            "tansu" => Ok(KafkaServer::Tansu),
            other => Err(format!("{other:?} is not a Kafka server: kafka (Apache Kafka's broker) or tansu")),
        }
    }
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Docker => "docker",
        }
    }
}

pub use crate::core::fault::Aiming;

fn is_default_aim(aim: &Aiming) -> bool {
    *aim == Aiming::Points
}

/// The images of a Docker run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DockerOptions {
    pub image: String,
    pub postgres_image: String,
    /// The brokers of the broker transports (`docker/brokers`).
    pub brokers_image: String,
    /// Mount the harness's own executable over the image's, so the services run
    /// exactly the harness's code (as the local backend does).
    pub mount_exe: bool,
}

impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions {
            image: "haunt:latest".into(),
            postgres_image: "haunt-postgres:latest".into(),
            brokers_image: "haunt-brokers:latest".into(),
            mount_exe: true,
        }
    }
}

/// Every option of a run. Written into `run.json` (`options`), and read
/// back by `haunt run --options FILE`, which is how the matrix and the
/// guarantees hand a child run its options: typed here, never as argv.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOptions {
    pub backend: BackendKind,
    pub docker: DockerOptions,
    pub time_limit: Duration,
    pub rate: f64,
    pub concurrency: usize,
    pub workers: usize,
    /// `None`: a fresh SQLite file in the run directory.
    pub db: Option<DbUrl>,
    /// A system file (`haunt run --system`): run that system instead of the
    /// reference pipeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<PathBuf>,
    /// How kills and pauses are aimed (`--aim`).
    #[serde(default, skip_serializing_if = "is_default_aim")]
    pub aim: Aiming,
    /// The system file's `[[variant]]` to run (`--variant`; `None`: its
    /// first, if it has any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// The faults to inject (`--nemesis`; `nemesis` in `run.json`).
    #[serde(rename = "nemesis")]
    pub faults: Vec<Fault>,
    pub nemesis_interval: Duration,
    pub seed: u64,
    pub store: PathBuf,
    pub visibility_timeout: Duration,
    pub quiesce_timeout: Duration,
    /// Deliveries a message gets before the workers dead-letter it.
    pub delivery_attempts_max: u32,
    /// Acks the workers drop all run long (0: none but the ack-loss fault's).
    pub ack_fail_rate: f64,
    /// The workers delete a batch's messages in its apply transaction
    /// (`haunt worker --ack-in-txn`): no ack to lose.
    pub ack_in_txn: bool,
    /// Faults that can hit any of these targets hit only these (empty: all).
    pub fault_targets: Vec<String>,
    /// Fault schedules running side by side (kinds dealt among them).
    pub faults_at_once: usize,
    /// Refuse a time limit that cannot fire every enabled fault once.
    pub fit_check: bool,
    /// Serve the harness's own metrics here while the run lasts.
    pub metrics_listen: Option<SocketAddr>,
    /// Keep serving them this long after the verdict, for a last scrape.
    pub metrics_linger: Duration,
    /// Write the scrape targets of this run (API, workers, harness) here, as a
    /// Prometheus `file_sd_configs` file.
    pub prometheus_sd: Option<PathBuf>,
    #[serde(serialize_with = "bug_name", deserialize_with = "bug_named")]
    pub bug: Option<Bug>,
    /// Where messages travel from the API to the workers: the database queue,
    /// or a broker that the run starts, with a relay in front of it.
    #[serde(serialize_with = "spelled", deserialize_with = "parsed")]
    pub transport: TransportSpec,
    pub quiet: bool,
    pub request_timeout: Duration,
    pub items: usize,
    /// Keys that each belong to one client (`key-0`, `key-1`, …), which
    /// places them in turn, so that each key's orders are a chain fixed in
    /// real time; the clients left without one order `items` as before. 0:
    /// none (absent from a `run.json` written before keys, which still runs).
    #[serde(default)]
    pub ordered_keys: usize,
    /// Kafka's nodes (`--transport kafka`): 1, or a cluster of 3, whose
    /// brokers' links and leaders take faults of their own. 1 when absent
    /// from a `run.json` written before clusters.
    #[serde(default = "one")]
    pub kafka_brokers: usize,
    /// The server behind `--transport kafka`: Apache Kafka's broker, or
    /// tansu. Kafka's when absent from a `run.json` written before tansu.
    #[serde(default)]
    pub kafka_server: KafkaServer,
    /// The windows to strike instead of the seeded schedule (`--schedule
    /// FILE`: a run's `schedule.json`); `faults` are those it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<crate::core::nemesis::ScheduleFile>,
    /// The data directory of the PostgreSQL server behind `db`, when the
    /// harness may crash and restart it (`db-restart`).
    pub pg_data: Option<PathBuf>,
    /// The executable that runs the services (the current `haunt`).
    pub exe: PathBuf,
    pub git_revision: String,
}

fn spelled<S: serde::Serializer>(transport: &TransportSpec, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(transport)
}

fn parsed<'de, D: serde::Deserializer<'de>>(d: D) -> Result<TransportSpec, D::Error> {
    String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
}

fn bug_name<S: serde::Serializer>(bug: &Option<Bug>, s: S) -> Result<S::Ok, S::Error> {
    match bug {
        Some(b) => s.serialize_str(b.name()),
        None => s.serialize_none(),
    }
}

fn bug_named<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Bug>, D::Error> {
    Option::<String>::deserialize(d)?.map(|name| name.parse().map_err(serde::de::Error::custom)).transpose()
}

impl Default for RunOptions {
    /// `haunt run`'s defaults: a minute of 100 ops/s from 8 clients against 3
    /// workers on SQLite, the seven local faults.
    fn default() -> Self {
        RunOptions {
            backend: BackendKind::Local,
            docker: DockerOptions::default(),
            time_limit: Duration::from_secs(60),
            rate: 100.0,
            concurrency: 8,
            workers: 3,
            db: None,
            system: None,
            variant: None,
            aim: Aiming::Points,
            faults: DEFAULT_FAULTS.to_vec(),
            nemesis_interval: Duration::from_secs(5),
            seed: 0,
            store: PathBuf::from("store"),
            visibility_timeout: Duration::from_secs(2),
            quiesce_timeout: Duration::from_secs(60),
            delivery_attempts_max: 10,
            ack_fail_rate: 0.0,
            ack_in_txn: false,
            fault_targets: Vec::new(),
            faults_at_once: 1,
            fit_check: true,
            metrics_listen: None,
            metrics_linger: Duration::ZERO,
            prometheus_sd: None,
            bug: None,
            transport: TransportSpec::default(),
            quiet: false,
            request_timeout: Duration::from_secs(2),
            items: 5,
            ordered_keys: 0,
            kafka_brokers: 1,
            kafka_server: KafkaServer::Kafka,
            schedule: None,
            pg_data: None,
            exe: PathBuf::from("haunt"),
            git_revision: "unknown".into(),
        }
    }
}

/// The faults of a run that names none: every kind a local run on SQLite can fire but the stall.
pub const DEFAULT_FAULTS: [Fault; 7] =
    [Fault::Kill, Fault::Pause, Fault::Partition, Fault::Delay, Fault::AckLoss, Fault::ClockSkew, Fault::DbError];

impl RunOptions {
    /// The database the pipeline will use: the Docker backend's own
    /// PostgreSQL, the server `db` names, or a SQLite file in the run directory.
    pub fn db_kind(&self) -> DbKind {
        match &self.db {
            _ if self.backend == BackendKind::Docker => DbKind::Postgres,
            Some(db) => db.kind(),
            None => DbKind::Sqlite,
        }
    }

    /// Whether the database is a node the harness can crash and restart.
    pub fn db_is_node(&self) -> bool {
        self.backend == BackendKind::Docker || (self.db_kind() == DbKind::Postgres && self.pg_data.is_some())
    }

    /// What `--nemesis all` means for the reference pipeline: the faults its
    /// layout can take (a system file's are its own: `crate::assemble::Target`).
    pub fn pipeline_faults(&self) -> Vec<Fault> {
        crate::core::fault::all_possible(
            self.db_is_node(),
            self.backend == BackendKind::Docker,
            self.transport.is_broker(),
            self.transport.is_broker() && self.transport.server_is_durable(),
        )
    }

    /// The faults of a pipeline run that names none: the seven local
    /// defaults; with a broker transport the broker and the relay take faults
    /// too: the broker's restart (where its server keeps data through one),
    /// the relay's kill, and the broker's links (relay<->broker,
    /// worker-N<->broker) join the links a partition picks from.
    pub fn pipeline_default_faults(&self) -> Vec<Fault> {
        if self.transport.is_broker() {
            let restart = self.transport.server_is_durable().then_some(Fault::BrokerRestart);
            DEFAULT_FAULTS.iter().copied().chain(restart).chain([Fault::RelayKill]).collect()
        } else {
            DEFAULT_FAULTS.to_vec()
        }
    }

    pub fn fault_settings(&self) -> FaultSettings {
        FaultSettings {
            visibility_timeout: self.visibility_timeout,
            request_timeout: self.request_timeout,
            ack_fail_rate: self.ack_fail_rate,
            fault_targets: self.fault_targets.clone(),
            aim: self.aim,
            seed: self.seed,
        }
    }

    /// Every check of the options, before anything is created: each error
    /// names the flag.
    /// The size of a Kafka cluster: 1 or 3, with Kafka, on the local backend.
    fn validate_kafka(&self, docker: bool) -> anyhow::Result<()> {
        anyhow::ensure!(
            matches!(self.kafka_brokers, 1 | 3),
            "--kafka-brokers {}: Kafka runs as 1 broker or a cluster of 3",
            self.kafka_brokers
        );
        anyhow::ensure!(
            self.kafka_brokers == 1 || self.transport.kind == haunt_transport::Kind::Kafka,
            "--kafka-brokers {} is the size of a Kafka cluster: use it with --transport kafka[:MODE]",
            self.kafka_brokers
        );
        anyhow::ensure!(
            self.kafka_brokers == 1 || !docker,
            "--kafka-brokers {} runs on the local backend only, for now (not with --backend docker)",
            self.kafka_brokers
        );
        if self.kafka_server == KafkaServer::Tansu {
            anyhow::ensure!(
                self.transport.kind == haunt_transport::Kind::Kafka,
                "--kafka-server tansu is the server behind Kafka's transport: use it with --transport kafka[:MODE]"
            );
            anyhow::ensure!(self.kafka_brokers == 1, "--kafka-server tansu runs one node: leave out --kafka-brokers");
            anyhow::ensure!(
                !docker,
                "--kafka-server tansu runs on the local backend only (tansu is in no Debian package or image)"
            );
            anyhow::ensure!(
                self.transport.mode() != "eos",
                "--transport {} needs Kafka's transactions, and tansu 0.6 has none (its answer to EndTxn: \
                 not supported by broker): use kafka:at-least-once or kafka:at-most-once",
                self.transport
            );
        }
        Ok(())
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.time_limit.is_zero(), "--time-limit-s must be positive");
        anyhow::ensure!(self.rate > 0.0 && self.rate.is_finite(), "--rate must be positive");
        anyhow::ensure!(self.concurrency > 0, "--concurrency must be positive");
        anyhow::ensure!(self.workers > 0, "--workers must be positive");
        anyhow::ensure!(self.items > 0, "--items must be positive");
        anyhow::ensure!(self.faults_at_once > 0, "--faults-at-once must be positive");
        anyhow::ensure!(self.delivery_attempts_max > 0, "--delivery-attempts-max must be positive");
        anyhow::ensure!(!self.nemesis_interval.is_zero(), "--nemesis-interval-s must be positive");
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.ack_fail_rate),
            "--ack-fail-rate must be within 0 and 1, got {}",
            self.ack_fail_rate
        );
        // A system file's own checks are its module's (`check_options`), on
        // the spec loaded once.
        if self.system.is_some() {
            anyhow::ensure!(
                self.db.is_none() && self.pg_data.is_none() && self.bug.is_none(),
                "--system runs the file's own nodes on their own database; leave out --db, --pg-data and --bug"
            );
        }
        let docker = self.backend == BackendKind::Docker;
        let broker = self.transport.is_broker();
        anyhow::ensure!(
            !broker || self.system.is_none(),
            "--transport {} is the reference pipeline's: a system file brings its own transport",
            self.transport
        );
        anyhow::ensure!(
            !broker || !self.ack_in_txn,
            "--ack-in-txn deletes from the database queue; with --transport {} the ack is the broker's",
            self.transport
        );
        if let Some(bug) = self.bug.filter(|b| b.needs_broker() && !broker) {
            anyhow::bail!("--bug {bug} is a bug of the relay, which only a broker transport has: add --transport NAME");
        }
        if let Some(bug) = self.bug.filter(|b| b.needs_order() && self.transport.order_claim() != OrderClaim::PerKey) {
            anyhow::bail!(
                "--bug {bug} breaks the order a broker keeps per key, and --transport {} keeps none: \
                 use a transport that claims order (sqs:fifo)",
                self.transport
            );
        }
        if let Some(bug) = self.bug.filter(|b| b.needs_kafka() && self.transport.kind != haunt_transport::Kind::Kafka) {
            anyhow::bail!("--bug {bug} is a bug of a Kafka consumer, which commits offsets: use --transport kafka");
        }
        self.validate_kafka(docker)?;
        if self.bug == Some(Bug::NoPublisherConfirms) && broker && !self.transport.has_publisher_confirms() {
            anyhow::bail!(
                "--bug no-publisher-confirms with --transport {}: its publish always waits for the server's reply, \
                 so the bug changes nothing there",
                self.transport
            );
        }
        anyhow::ensure!(
            broker || !self.faults.contains(&Fault::BrokerRestart),
            "--nemesis broker-restart needs a broker: --transport NAME"
        );
        anyhow::ensure!(
            broker || !self.faults.contains(&Fault::RelayKill),
            "--nemesis relay-kill needs a relay, which only a broker transport has: --transport NAME"
        );
        anyhow::ensure!(
            !broker || self.transport.server_is_durable() || !self.faults.contains(&Fault::BrokerRestart),
            "--nemesis broker-restart with --transport {}: its server (moto, an emulator) keeps its queues in memory, \
             so a restart loses them whatever SQS would do",
            self.transport
        );
        anyhow::ensure!(
            !docker || (self.db.is_none() && self.pg_data.is_none()),
            "--backend docker runs its own PostgreSQL container; leave out --db and --pg-data"
        );
        anyhow::ensure!(
            self.pg_data.is_none() || self.db_kind() == DbKind::Postgres,
            "--pg-data names the PostgreSQL server behind --db; give --db postgres://… too"
        );
        anyhow::ensure!(
            // A system file's links between containers are checked by `system_file::check_options`.
            docker || self.system.is_some() || !self.faults.contains(&Fault::Loss),
            "--nemesis loss drops packets with iptables in containers: it needs --backend docker"
        );
        anyhow::ensure!(
            self.db_is_node() || !self.faults.contains(&Fault::DbRestart),
            "--nemesis db-restart needs --pg-data DIR (the data directory of the PostgreSQL server behind --db), \
             or --backend docker"
        );
        // A given schedule is struck as given, each window in its place.
        if self.fit_check && self.schedule.is_none() {
            check_fault_fit(self)?;
        }
        Ok(())
    }
}

/// Seconds for a message: `2.5`, `4`.
fn secs(d: Duration) -> String {
    let text = format!("{:.1}", d.as_secs_f64());
    text.strip_suffix(".0").map(str::to_owned).unwrap_or(text)
}

/// Refuses a time limit that cannot fire every enabled fault once, and says
/// what would fit.
fn check_fault_fit(options: &RunOptions) -> anyhow::Result<()> {
    let kinds: Vec<(&str, Duration)> =
        options.faults.iter().map(|f| (f.name(), f.hold_min(options.visibility_timeout))).collect();
    let (interval, limit) = (options.nemesis_interval, options.time_limit);
    let Err(unfit) = crate::core::nemesis::check_fit(&kinds, interval, options.faults_at_once, limit) else {
        return Ok(());
    };
    let holds: Vec<String> = kinds.iter().map(|(n, h)| format!("{n} {}", secs((*h).max(interval / 2)))).collect();
    let busiest = match options.faults_at_once {
        1 => String::new(),
        n => format!(" for the busiest of {n} schedules"),
    };
    let fewer = match unfit.fitting.as_slice() {
        [] => format!("no fault fits in {} s", secs(limit)),
        fitting => format!("--nemesis {} fits in {} s", fitting.join(","), secs(limit)),
    };
    anyhow::bail!(
        "a {} s run cannot fire each of its {} faults once: each takes at least {} s of calm before it (half of \
         --nemesis-interval-s), its hold in s ({}) and {} s to start and stop, {} s in all{busiest}. \
         Use --time-limit-s {} or more, or fewer faults ({fewer}), or a shorter --nemesis-interval-s; \
         --skip-fit-check runs anyway",
        secs(limit),
        kinds.len(),
        secs(interval / 2),
        holds.join(", "),
        secs(ACT_ALLOWANCE),
        secs(unfit.needed),
        unfit.needed.as_secs_f64().ceil() as u64,
    )
}

fn one() -> usize {
    1
}
