//! One run, start to verdict: start the cluster, drive the workload while the
//! nemesis breaks things, heal, wait for the queue to drain, read the final
//! state, check, report.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use haunt_checker::Results;
use haunt_format::{FINAL_STATE_FILE, FinalLine, HISTORY_FILE, JsonlWriter, Meta, RESULTS_FILE, RUN_FILE};
use haunt_store::{Bug, Rng, Store, StoreOptions};
use serde::Serialize;
use tokio::time::Instant;

use crate::docker::{ContainerSpec, DockerBackend, IptablesLink, LossNemesis, Peer, postgres_node};
use crate::history::Recorder;
use crate::local::{LocalBackend, NodeSpec, api_node, worker_node};
use crate::nemesis::{
    ACT_ALLOWANCE, AckLossNemesis, ActiveFaults, Admin, ClockSkewNemesis, Coverage, DbErrorNemesis, DelayNemesis,
    Faults, KillNemesis, OnlyTargets, PartitionNemesis, PauseNemesis, ScheduleOptions, SharedLink, StallNemesis,
    hold_min_for,
};
use crate::postgres::{DbRestartNemesis, PgServer};
use crate::proxy::FaultProxy;
use crate::roles::{Backend, Checker, Nemesis, Node, Role, RunDirChecker};
use crate::workload::{HttpClient, WorkloadOptions};

/// Where the pipeline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Child processes of the harness, over SQLite or a PostgreSQL server given by URL.
    #[default]
    Local,
    /// Containers on a private network, with a PostgreSQL container of their own.
    Docker,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Docker => "docker",
        }
    }
}

/// The images of a Docker run.
#[derive(Debug, Clone, Serialize)]
pub struct DockerOptions {
    pub image: String,
    pub postgres_image: String,
    /// Mount the harness's own executable over the image's, so the services run
    /// exactly the harness's code (as the local backend does).
    pub mount_exe: bool,
}

impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions { image: "haunt:latest".into(), postgres_image: "haunt-postgres:latest".into(), mount_exe: true }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunOptions {
    pub backend: BackendKind,
    pub docker: DockerOptions,
    pub time_limit: Duration,
    pub rate: f64,
    pub concurrency: usize,
    pub workers: usize,
    /// `None`: a fresh SQLite file in the run directory.
    pub db: Option<String>,
    pub nemesis: Vec<String>,
    pub nemesis_interval: Duration,
    pub seed: u64,
    pub store: PathBuf,
    pub visibility_timeout: Duration,
    pub quiesce_timeout: Duration,
    /// Deliveries a message gets before the workers dead-letter it.
    pub delivery_attempts_max: u32,
    /// Acks the workers drop all run long (0: none but the ack-loss fault's).
    pub ack_fail_rate: f64,
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
    #[serde(serialize_with = "bug_name")]
    pub bug: Option<Bug>,
    pub quiet: bool,
    pub request_timeout: Duration,
    pub items: usize,
    /// The data directory of the PostgreSQL server behind `db`, when the
    /// harness may crash and restart it (`db-restart`).
    pub pg_data: Option<PathBuf>,
    /// The executable that runs the services (the current `haunt`).
    pub exe: PathBuf,
    pub git_revision: String,
}

fn bug_name<S: serde::Serializer>(bug: &Option<Bug>, s: S) -> Result<S::Ok, S::Error> {
    match bug {
        Some(b) => s.serialize_str(b.name()),
        None => s.serialize_none(),
    }
}

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    pub run_dir: PathBuf,
    /// `None` when the run was aborted before it could be checked.
    pub results: Option<Results>,
    pub aborted: bool,
    /// Enabled faults that never started (empty for a run that did not finish).
    pub faults_never_fired: Vec<String>,
}

#[derive(Debug, Serialize)]
struct RunFile<'a> {
    haunt_version: &'static str,
    git_revision: &'a str,
    seed: u64,
    backend: &'static str,
    db: &'a str,
    options: &'a RunOptions,
    started_at_ms: i64,
    ended_at_ms: Option<i64>,
    aborted: bool,
    /// Why the run stopped early, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    verdict: Option<&'static str>,
    /// How often each enabled fault (`options.nemesis`) started.
    #[serde(skip_serializing_if = "Option::is_none")]
    faults_fired: Option<std::collections::BTreeMap<String, u32>>,
    /// The enabled faults that never started: the run did not test them.
    #[serde(skip_serializing_if = "Option::is_none")]
    faults_never_fired: Option<Vec<String>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// `20261129T150405Z` from Unix milliseconds (UTC).
fn timestamp(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A free port and the listener that holds it. Held until the ports of a
/// cluster are all chosen and its fault proxies listen, so that none of them
/// is handed the same port (a proxy that got the API's port forwarded to
/// itself, and the API could not bind: a run that never became ready). Once
/// released another process could still take it before the service binds,
/// which on a test machine is rare enough, and then the service fails loudly.
fn reserve_port() -> anyhow::Result<(SocketAddr, std::net::TcpListener)> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok((l.local_addr()?, l))
}

/// Creates `store/<name>/<timestamp>/` and points `store/latest` at it.
fn create_run_dir(store: &Path, name: &str, started_at_ms: i64) -> anyhow::Result<PathBuf> {
    let mut dir = store.join(name).join(timestamp(started_at_ms));
    let mut n = 1;
    while dir.exists() {
        n += 1;
        dir = store.join(name).join(format!("{}-{n}", timestamp(started_at_ms)));
    }
    std::fs::create_dir_all(dir.join("logs")).with_context(|| format!("creating {}", dir.display()))?;
    let latest = store.join("latest");
    let _ = std::fs::remove_file(&latest);
    let relative = dir.strip_prefix(store).unwrap_or(&dir);
    std::os::unix::fs::symlink(relative, &latest).with_context(|| format!("linking {}", latest.display()))?;
    Ok(dir)
}

fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, format!("{text}\n")).with_context(|| format!("writing {}", path.display()))
}

async fn wait_http_ok(url: &str, limit: Duration) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build()?;
    let deadline = Instant::now() + limit;
    loop {
        // The last answer is kept for the error: refused (the process is not
        // listening, or died), a timeout, or the service's own reason.
        let last = match http.get(url).send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default().trim()),
            Err(e) => format!("{e:#}"),
        };
        anyhow::ensure!(
            Instant::now() < deadline,
            "{url} did not answer within {limit:?} (last: {last}; the service's log is in the run's logs/)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The backend of a run: one type, so the nemeses need not know which.
#[derive(Debug)]
enum ClusterBackend {
    Local(LocalBackend),
    Docker(Arc<DockerBackend>),
}

impl Backend for ClusterBackend {
    fn nodes(&self) -> Vec<Node> {
        match self {
            ClusterBackend::Local(b) => b.nodes(),
            ClusterBackend::Docker(b) => b.nodes(),
        }
    }
    async fn start(&self, node: &Node) -> anyhow::Result<()> {
        match self {
            ClusterBackend::Local(b) => b.start(node).await,
            ClusterBackend::Docker(b) => b.start(node).await,
        }
    }
    async fn stop(&self, node: &Node) -> anyhow::Result<()> {
        match self {
            ClusterBackend::Local(b) => b.stop(node).await,
            ClusterBackend::Docker(b) => b.stop(node).await,
        }
    }
    async fn kill(&self, node: &Node) -> anyhow::Result<()> {
        match self {
            ClusterBackend::Local(b) => b.kill(node).await,
            ClusterBackend::Docker(b) => b.kill(node).await,
        }
    }
    async fn pause(&self, node: &Node) -> anyhow::Result<()> {
        match self {
            ClusterBackend::Local(b) => b.pause(node).await,
            ClusterBackend::Docker(b) => b.pause(node).await,
        }
    }
    async fn resume(&self, node: &Node) -> anyhow::Result<()> {
        match self {
            ClusterBackend::Local(b) => b.resume(node).await,
            ClusterBackend::Docker(b) => b.resume(node).await,
        }
    }
    fn resume_blocking(&self, node: &Node) -> anyhow::Result<()> {
        match self {
            ClusterBackend::Local(b) => b.resume_blocking(node),
            ClusterBackend::Docker(b) => b.resume_blocking(node),
        }
    }
    fn is_running(&self, node: &Node) -> bool {
        match self {
            ClusterBackend::Local(b) => b.is_running(node),
            ClusterBackend::Docker(b) => b.is_running(node),
        }
    }
}

impl ClusterBackend {
    /// Ends every node at once and, for containers, keeps their logs and
    /// removes them. Idempotent.
    fn teardown(&self, logs: &Path) {
        match self {
            ClusterBackend::Local(b) => b.kill_all(),
            ClusterBackend::Docker(b) => {
                b.save_logs(logs);
                b.remove();
            }
        }
    }
}

/// Everything the run started, so it can be torn down on any path.
struct Cluster {
    backend: Arc<ClusterBackend>,
    api_url: String,
    /// The clients' way to the API: a fault proxy, which can also delay answers.
    client_proxy: Arc<FaultProxy>,
    worker_admin: Vec<(String, String)>,
    /// Links the partition nemesis can cut, by name (`client<->api`, `worker-1<->db`).
    links: Vec<(String, SharedLink)>,
    /// Links through a fault proxy, which the delay nemesis can slow down.
    proxies: Vec<(String, Arc<FaultProxy>)>,
    /// Links where the Docker backend can drop packets at random.
    lossy: Vec<(String, Arc<IptablesLink>)>,
    /// The database as a node of the cluster (Docker), for `db-restart`.
    db_node: Option<Node>,
}

/// Splits a `postgres://` URL around its `host:port`.
fn split_postgres_url(url: &str) -> Option<(&str, &str, &str)> {
    let scheme_end = url.find("://")? + 3;
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host_start = authority.rfind('@').map_or(0, |i| i + 1);
    let host_port = &authority[host_start..];
    if host_port.is_empty() {
        return None;
    }
    let before = &url[..scheme_end + host_start];
    let after = &rest[authority_end..];
    Some((before, host_port, after))
}

/// One fault proxy per service in front of PostgreSQL; each service gets a URL
/// that points at its own proxy, so one link can be cut at a time.
async fn db_proxies(db: &str, names: &[String]) -> anyhow::Result<Vec<(String, Arc<FaultProxy>, String)>> {
    if db.starts_with("sqlite:") {
        return Ok(Vec::new());
    }
    let Some((before, host_port, after)) = split_postgres_url(db) else {
        tracing::warn!("{db}: no host:port to put a fault proxy in front of; database links cannot be partitioned");
        return Ok(Vec::new());
    };
    let host_port = if host_port.contains(':') { host_port.to_owned() } else { format!("{host_port}:5432") };
    let target = tokio::net::lookup_host(&host_port)
        .await
        .with_context(|| format!("resolving {host_port}"))?
        .next()
        .with_context(|| format!("{host_port} resolves to nothing"))?;
    let mut out = Vec::new();
    for name in names {
        let proxy = Arc::new(FaultProxy::start(target).await?);
        let url = format!("{before}{}{after}", proxy.addr());
        out.push((format!("{name}<->db"), proxy, url));
    }
    Ok(out)
}

async fn start_cluster(options: &RunOptions, db: &str, run_dir: &Path, token: &str) -> anyhow::Result<Cluster> {
    let mut names = vec![api_node().name];
    names.extend((1..=options.workers).map(|i| worker_node(i).name));
    let proxies = db_proxies(db, &names).await?;
    let db_for = |name: &str| -> String {
        let link = format!("{name}<->db");
        proxies.iter().find(|(l, _, _)| *l == link).map_or_else(|| db.to_owned(), |(_, _, url)| url.clone())
    };
    let mut reserved = Vec::new();
    let (api_addr, held) = reserve_port()?;
    reserved.push(held);
    let bug: Vec<String> = options.bug.map(|b| vec!["--bug".into(), b.name().into()]).unwrap_or_default();
    let mut specs = vec![NodeSpec {
        node: api_node(),
        args: [vec!["api".into(), "--db".into(), db_for("api"), "--listen".into(), api_addr.to_string()], bug.clone()]
            .concat(),
    }];
    let mut worker_admin = Vec::new();
    for i in 1..=options.workers {
        let node = worker_node(i);
        let (metrics, held) = reserve_port()?;
        reserved.push(held);
        worker_admin.push((node.name.clone(), format!("http://{metrics}")));
        let args = worker_args(options, &db_for(&node.name), &node, &metrics.to_string());
        specs.push(NodeSpec { node, args });
    }
    let env = vec![("HAUNT_ADMIN_TOKEN".to_owned(), token.to_owned()), ("NO_COLOR".to_owned(), "1".to_owned())];
    let backend = LocalBackend::new(options.exe.clone(), run_dir.join("logs"), env, specs);
    let client_proxy = Arc::new(FaultProxy::start(api_addr).await?);
    // Every port is chosen and every proxy listens: the services may bind theirs.
    drop(reserved);
    let mut all: Vec<(String, Arc<FaultProxy>)> = vec![("client<->api".into(), client_proxy.clone())];
    all.extend(proxies.into_iter().map(|(link, proxy, _)| (link, proxy)));
    Ok(Cluster {
        backend: Arc::new(ClusterBackend::Local(backend)),
        api_url: format!("http://{api_addr}"),
        client_proxy,
        worker_admin,
        links: all.iter().map(|(n, p)| (n.clone(), p.clone() as SharedLink)).collect(),
        proxies: all,
        lossy: Vec::new(),
        db_node: None,
    })
}

/// The arguments every worker gets, wherever it runs.
fn worker_args(options: &RunOptions, db: &str, node: &Node, metrics: &str) -> Vec<String> {
    let mut args = vec![
        "worker".into(),
        "--db".into(),
        db.to_owned(),
        "--worker-id".into(),
        node.name.clone(),
        "--visibility-timeout-ms".into(),
        options.visibility_timeout.as_millis().to_string(),
        "--delivery-attempts-max".into(),
        options.delivery_attempts_max.to_string(),
        "--metrics-listen".into(),
        metrics.to_owned(),
    ];
    if options.ack_fail_rate > 0.0 {
        args.extend(["--ack-fail-rate".into(), options.ack_fail_rate.to_string()]);
    }
    if let Some(bug) = options.bug {
        args.extend(["--bug".into(), bug.name().into()]);
    }
    args
}

/// The Docker cluster: a PostgreSQL container (started and healthy when this
/// returns, with the run's store open on it), the API and the workers (created).
async fn start_docker_cluster(
    options: &RunOptions,
    run_id: &str,
    token: &str,
) -> anyhow::Result<(Cluster, String, Store)> {
    const API_PORT: u16 = 8080;
    const METRICS_PORT: u16 = 9090;
    let pg = postgres_node();
    let pg_host = format!("haunt-{run_id}-{}", pg.name);
    let db_inside = format!("postgres://postgres@{pg_host}:5432/postgres");
    // Held until every port is chosen, so that no two are the same.
    let mut reserved = Vec::new();
    let mut port = || -> anyhow::Result<u16> {
        let (addr, held) = reserve_port()?;
        reserved.push(held);
        Ok(addr.port())
    };
    let pg_port = port()?;
    let api_port = port()?;
    let common_env = vec![("HAUNT_ADMIN_TOKEN".to_owned(), token.to_owned()), ("NO_COLOR".to_owned(), "1".to_owned())];
    let bug: Vec<String> = options.bug.map(|b| vec!["--bug".into(), b.name().into()]).unwrap_or_default();
    let mut specs = vec![
        ContainerSpec {
            node: pg.clone(),
            image: options.docker.postgres_image.clone(),
            args: Vec::new(),
            env: Vec::new(),
            ports: vec![(pg_port, 5432)],
            net_admin: false,
        },
        ContainerSpec {
            node: api_node(),
            image: options.docker.image.clone(),
            args: [
                vec!["api".into(), "--db".into(), db_inside.clone(), "--listen".into(), format!("0.0.0.0:{API_PORT}")],
                bug,
            ]
            .concat(),
            env: common_env.clone(),
            ports: vec![(api_port, API_PORT)],
            net_admin: true,
        },
    ];
    let mut worker_admin = Vec::new();
    for i in 1..=options.workers {
        let node = worker_node(i);
        let metrics_port = port()?;
        worker_admin.push((node.name.clone(), format!("http://127.0.0.1:{metrics_port}")));
        let mut env = common_env.clone();
        env.push(("HAUNT_HEALTH_URL".into(), format!("http://127.0.0.1:{METRICS_PORT}/healthz")));
        specs.push(ContainerSpec {
            args: worker_args(options, &db_inside, &node, &format!("0.0.0.0:{METRICS_PORT}")),
            node,
            image: options.docker.image.clone(),
            env,
            ports: vec![(metrics_port, METRICS_PORT)],
            net_admin: true,
        });
    }
    // Released for the engine, which binds them when the containers start.
    drop(reserved);
    let mount = options.docker.mount_exe.then(|| options.exe.clone());
    let docker = Arc::new(DockerBackend::create(run_id, mount, specs).await?);
    docker.start(&pg).await?;
    docker.wait_healthy(&pg, Duration::from_secs(90)).await?;
    let db = format!("postgres://postgres@127.0.0.1:{pg_port}/postgres");
    let store = open_empty(&db).await?;

    let api = api_node();
    let mut lossy = vec![(
        "client<->api".to_owned(),
        Arc::new(IptablesLink::new(docker.clone(), api.clone(), Peer::Host { port: API_PORT })),
    )];
    for node in std::iter::once(api.clone()).chain((1..=options.workers).map(worker_node)) {
        let link = IptablesLink::new(docker.clone(), node.clone(), Peer::Node(pg.clone()));
        lossy.push((format!("{}<->db", node.name), Arc::new(link)));
    }
    let api_addr: SocketAddr = ([127, 0, 0, 1], api_port).into();
    let client_proxy = Arc::new(FaultProxy::start(api_addr).await?);
    let cluster = Cluster {
        backend: Arc::new(ClusterBackend::Docker(docker)),
        api_url: format!("http://{api_addr}"),
        proxies: vec![("client<->api".into(), client_proxy.clone())],
        client_proxy,
        worker_admin,
        links: lossy.iter().map(|(n, l)| (n.clone(), l.clone() as SharedLink)).collect(),
        lossy,
        db_node: Some(pg),
    };
    Ok((cluster, db, store))
}

fn nemeses(options: &RunOptions, cluster: &Cluster, token: &str) -> anyhow::Result<Faults> {
    let workers: Vec<Node> = (1..=options.workers).map(worker_node).collect();
    let admin = Admin::new(token.to_owned(), cluster.worker_admin.clone())?;
    let mut every_service = vec![(api_node().name, cluster.api_url.clone())];
    every_service.extend(cluster.worker_admin.iter().cloned());
    let every_service = Admin::new(token.to_owned(), every_service)?;
    let mut list: Vec<Box<dyn Nemesis>> = Vec::new();
    for name in &options.nemesis {
        match name.as_str() {
            "kill" => {
                let targets = [vec![api_node()], workers.clone()].concat();
                list.push(Box::new(KillNemesis::new(cluster.backend.clone(), targets)));
            }
            "pause" => list.push(Box::new(PauseNemesis::new(
                cluster.backend.clone(),
                workers.clone(),
                options.visibility_timeout,
            ))),
            "partition" => list.push(Box::new(PartitionNemesis::new(cluster.links.clone()))),
            // Past the client's timeout: answers arrive after the client gave up.
            "delay" => list.push(Box::new(DelayNemesis::new(
                cluster.proxies.clone(),
                options.request_timeout + options.request_timeout / 4,
            ))),
            // One statement in three fails: enough to hit most multi-step paths,
            // few enough that retries get through.
            "db-error" => list.push(Box::new(DbErrorNemesis::new(every_service.clone(), 0.3))),
            // Half the acks lost: most messages come back at least once.
            "ack-loss" => list.push(Box::new(AckLossNemesis::new(admin.clone(), 0.5, options.ack_fail_rate))),
            "stall" => list.push(Box::new(StallNemesis::new(admin.clone(), options.visibility_timeout))),
            // Ten minutes ahead, as after a bad NTP step: a worker that trusts its
            // clock leases for ten minutes, past any quiesce timeout.
            "clock-skew" => {
                let offset = 10 * 60 * 1000;
                list.push(Box::new(ClockSkewNemesis::new(admin.clone(), offset)))
            }
            // One packet in four lost: TCP gets through, slowly, and some
            // requests outlast their timeout.
            "loss" if !cluster.lossy.is_empty() => list.push(Box::new(LossNemesis::new(cluster.lossy.clone(), 0.25))),
            "loss" => {
                anyhow::bail!("--nemesis loss drops packets with iptables in containers: it needs --backend docker")
            }
            "db-restart" if cluster.db_node.is_some() => {
                let db = cluster.db_node.clone().into_iter().collect();
                list.push(Box::new(KillNemesis::named("db-restart", cluster.backend.clone(), db)));
            }
            "db-restart" => {
                let data = options.pg_data.as_ref().context(
                    "--nemesis db-restart needs --pg-data DIR: the data directory of the PostgreSQL server \
                     behind --db, which the harness will kill and restart",
                )?;
                list.push(Box::new(DbRestartNemesis::new(PgServer::new(data)?)));
            }
            other => anyhow::bail!("unknown nemesis {other:?}"),
        }
    }
    if !options.fault_targets.is_empty() {
        list = list.into_iter().map(|n| OnlyTargets::wrap(n, &options.fault_targets)).collect();
    }
    for n in &list {
        // The fit check ran on hold_min_for before the nemeses existed.
        assert_eq!(
            n.hold_min(),
            hold_min_for(n.name(), options.visibility_timeout),
            "hold_min_for must know the hold of {}",
            n.name()
        );
    }
    Ok(Faults::new(list))
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
        options.nemesis.iter().map(|n| (n.as_str(), hold_min_for(n, options.visibility_timeout))).collect();
    let (interval, limit) = (options.nemesis_interval, options.time_limit);
    let Err(unfit) = crate::nemesis::check_fit(&kinds, interval, options.faults_at_once, limit) else {
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

/// Serves `/metrics` (OpenMetrics) on `addr` until the returned handle drops.
async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<haunt_telemetry::metrics::HarnessMetrics>,
) -> anyhow::Result<AbortOnDrop> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move {
                let body = haunt_telemetry::metrics::encode(&metrics.registry);
                ([(axum::http::header::CONTENT_TYPE, haunt_telemetry::OPENMETRICS_CONTENT_TYPE)], body)
            }
        }),
    );
    Ok(AbortOnDrop(tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })))
}

/// Stops a background task when dropped, on every path out of a run.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Opens (and migrates) the run's database, which must be empty: the checker
/// judges every row against this run's history, and rows from an earlier run
/// would all look like anomalies.
async fn open_empty(db: &str) -> anyhow::Result<Store> {
    let store = Store::connect(db, StoreOptions::default()).await.with_context(|| format!("opening {db}"))?;
    anyhow::ensure!(
        store.is_empty().await?,
        "{db} already holds orders or messages; give each run a fresh, empty database"
    );
    Ok(store)
}

/// Runs one test. `abort` (Ctrl-C) stops it early: faults are healed, processes
/// stopped, and the run directory marked aborted.
pub async fn run(options: RunOptions, abort: Arc<AtomicBool>) -> anyhow::Result<RunOutcome> {
    let started_at_ms = now_ms();
    let backend_name = options.backend.name();
    let db_kind = match &options.db {
        _ if options.backend == BackendKind::Docker => "postgres",
        Some(url) if !url.starts_with("sqlite:") => "postgres",
        _ => "sqlite",
    };
    // Before anything exists: a refused run leaves nothing behind.
    if options.fit_check {
        check_fault_fit(&options)?;
    }
    if options.backend == BackendKind::Docker {
        anyhow::ensure!(
            options.db.is_none() && options.pg_data.is_none(),
            "--backend docker runs its own PostgreSQL container; leave out --db and --pg-data"
        );
        crate::docker::ensure_engine().await?;
        crate::docker::ensure_image(&options.docker.image).await?;
        crate::docker::ensure_image(&options.docker.postgres_image).await?;
    }
    let name = match options.bug {
        Some(bug) => format!("{backend_name}-{db_kind}-{}", bug.name()),
        None => format!("{backend_name}-{db_kind}"),
    };
    // A database given by URL is checked before anything is created, so a
    // refused run leaves nothing behind.
    let given = match &options.db {
        Some(url) => Some((url.clone(), open_empty(url).await?)),
        None => None,
    };
    let run_dir = create_run_dir(&options.store, &name, started_at_ms)?;
    let mut token_rng = Rng::from_entropy();
    let token = format!("{:016x}{:016x}", token_rng.next_u64(), token_rng.next_u64());
    let mut docker_cluster = None;
    let (db, store) = match given {
        Some(given) => given,
        None if options.backend == BackendKind::Docker => {
            let run_id = format!("{:08x}", token_rng.next_u64() as u32);
            say(&options, &format!("starting containers haunt-{run_id}-* (PostgreSQL first)"));
            let (cluster, db, store) = start_docker_cluster(&options, &run_id, &token).await?;
            docker_cluster = Some(cluster);
            (db, store)
        }
        None => {
            let url = format!("sqlite://{}", run_dir.join("haunt.db").display());
            let store = open_empty(&url).await?;
            (url, store)
        }
    };
    let mut run_file = RunFile {
        haunt_version: env!("CARGO_PKG_VERSION"),
        git_revision: &options.git_revision,
        seed: options.seed,
        backend: backend_name,
        db: &db,
        options: &options,
        started_at_ms,
        ended_at_ms: None,
        aborted: false,
        error: None,
        verdict: None,
        faults_fired: None,
        faults_never_fired: None,
    };
    write_json(&run_dir.join(RUN_FILE), &run_file)?;
    say(&options, &format!("run {} (seed {}, revision {})", run_dir.display(), options.seed, options.git_revision));

    let metrics = Arc::new(haunt_telemetry::metrics::HarnessMetrics::default());
    let metrics_server = match options.metrics_listen {
        Some(addr) => Some(serve_metrics(addr, metrics.clone()).await?),
        None => None,
    };
    let cluster = match docker_cluster {
        Some(cluster) => cluster,
        None => start_cluster(&options, &db, &run_dir, &token).await?,
    };
    let outcome = drive(&options, &cluster, &store, &run_dir, &token, &abort, &metrics).await;

    // Whatever happened above, no service is left running; the database (a
    // container of the Docker backend) stays up for the final state.
    for node in cluster.backend.nodes().into_iter().filter(|n| n.role != Role::Database) {
        if let Err(e) = cluster.backend.stop(&node).await {
            tracing::warn!(node = %node.name, error = ?e, "stopping");
        }
    }
    if outcome.is_err() || abort.load(Ordering::Relaxed) {
        cluster.backend.teardown(&run_dir.join("logs"));
    }

    let aborted = abort.load(Ordering::Relaxed);
    run_file.aborted = aborted;
    let mut never_fired = Vec::new();
    if let Ok(driven) = &outcome {
        run_file.faults_fired = Some(driven.coverage.counts());
        never_fired = driven.coverage.never_fired();
        run_file.faults_never_fired = Some(never_fired.clone());
    }
    let results = match outcome {
        Ok(driven) if !aborted => {
            let recorder_done = finish_final_state(&store, &run_dir, driven.drained, &driven.recorder).await;
            store.close().await;
            cluster.backend.teardown(&run_dir.join("logs"));
            recorder_done?;
            let results = RunDirChecker.check(&run_dir).map_err(|e| anyhow::anyhow!("checking the run: {e}"))?;
            write_json(&run_dir.join(RESULTS_FILE), &results)?;
            let history = std::fs::read_to_string(run_dir.join(HISTORY_FILE)).unwrap_or_default();
            // Faults that never fired get their own warning box in the report.
            let summary = run_file_summary(&options, &db, &run_dir);
            let final_state = std::fs::read_to_string(run_dir.join(FINAL_STATE_FILE)).unwrap_or_default();
            let coverage = crate::report::Coverage {
                faults_fired: run_file.faults_fired.clone(),
                faults_never_fired: run_file.faults_never_fired.clone(),
            };
            let report = crate::report::render(&crate::report::Page {
                results: &results,
                history: &history,
                final_state: &final_state,
                coverage: &coverage,
                subtitle: &summary,
            });
            std::fs::write(run_dir.join("report.html"), report).context("writing report.html")?;
            run_file.verdict = Some(results.valid.as_str());
            metrics.check_valid.set(match results.valid {
                haunt_checker::Verdict::Valid => 1,
                haunt_checker::Verdict::Invalid => 0,
                haunt_checker::Verdict::Unknown => -1,
            });
            for (anomaly, report) in &results.anomalies {
                let labels = haunt_telemetry::metrics::AnomalyLabels { anomaly: anomaly.clone() };
                metrics.check_anomalies.get_or_create(&labels).set(report.count as i64);
            }
            if metrics_server.is_some() && !options.metrics_linger.is_zero() {
                tokio::time::sleep(options.metrics_linger).await;
            }
            Some(results)
        }
        Ok(_) => None,
        Err(e) => {
            run_file.error = Some(format!("{e:#}"));
            run_file.ended_at_ms = Some(now_ms());
            write_json(&run_dir.join(RUN_FILE), &run_file)?;
            return Err(e);
        }
    };
    run_file.ended_at_ms = Some(now_ms());
    write_json(&run_dir.join(RUN_FILE), &run_file)?;
    Ok(RunOutcome { run_dir, results, aborted, faults_never_fired: never_fired })
}

fn run_file_summary(options: &RunOptions, db: &str, run_dir: &Path) -> String {
    format!(
        "{} · seed {} · revision {} · {} workers · nemesis {} · db {}",
        run_dir.display(),
        options.seed,
        options.git_revision,
        options.workers,
        if options.nemesis.is_empty() { "none".to_owned() } else { options.nemesis.join(",") },
        db
    )
}

/// What [`drive`] leaves for the rest of the run.
struct Driven {
    /// Whether the queue drained after the heal.
    drained: bool,
    recorder: Arc<Recorder>,
    coverage: Coverage,
}

/// Starts the nodes, runs the workload and the faults, heals, and waits for the
/// queue to drain.
async fn drive(
    options: &RunOptions,
    cluster: &Cluster,
    store: &Store,
    run_dir: &Path,
    token: &str,
    abort: &Arc<AtomicBool>,
    metrics: &Arc<haunt_telemetry::metrics::HarnessMetrics>,
) -> anyhow::Result<Driven> {
    for node in cluster.backend.nodes() {
        cluster.backend.start(&node).await?;
    }
    // A cold start compiles nothing but opens the database and migrates; 30 s
    // covers a slow disk.
    wait_http_ok(&format!("{}/readyz", cluster.api_url), Duration::from_secs(30)).await?;
    for (_, admin) in &cluster.worker_admin {
        wait_http_ok(&format!("{admin}/healthz"), Duration::from_secs(30)).await?;
    }
    if let Some(path) = &options.prometheus_sd {
        write_scrape_targets(path, options, cluster, run_dir)?;
    }
    // Owns the faults from here: a panic or an early return below heals them
    // when it drops.
    let nemeses = nemeses(options, cluster, token)?;
    let recorder = Arc::new(Recorder::create(&run_dir.join(HISTORY_FILE))?);
    let active = Arc::new(ActiveFaults::with_metrics(metrics.clone()));
    let deadline = Instant::now() + options.time_limit;

    let client =
        Arc::new(HttpClient::new(&format!("http://{}", cluster.client_proxy.addr()), options.request_timeout)?);
    let workload = tokio::spawn(crate::workload::run(
        client,
        recorder.clone(),
        WorkloadOptions {
            concurrency: options.concurrency,
            rate: options.rate,
            items: options.items,
            retries_max: 3,
            seed: options.seed,
            deadline,
            metrics: Some(metrics.clone()),
        },
        abort.clone(),
    ));
    let progress = tokio::spawn(progress(
        options.clone(),
        recorder.clone(),
        active.clone(),
        cluster.worker_admin.clone(),
        deadline,
        abort.clone(),
    ));
    let schedule = ScheduleOptions { interval: options.nemesis_interval, seed: options.seed.rotate_left(17), deadline };
    let coverage =
        crate::nemesis::run_schedule(&nemeses, &recorder, &active, schedule, options.faults_at_once, abort).await;
    let workload_result = workload.await;
    let retry_for = crate::nemesis::stop_retry_for(&nemeses, options.nemesis_interval);
    let heal = crate::nemesis::heal_all(&nemeses, &recorder, &active, retry_for).await;
    progress.abort();
    workload_result.context("the workload panicked")?;
    heal?;
    // A node can also die on its own (a bug mode may crash it): the queue only
    // drains if every node runs.
    for node in cluster.backend.nodes() {
        if !cluster.backend.is_running(&node) {
            say(options, &format!("{} was not running after heal; starting it", node.name));
            cluster.backend.start(&node).await?;
        }
    }
    if abort.load(Ordering::Relaxed) {
        return Ok(Driven { drained: false, recorder, coverage });
    }
    say(options, "healed; waiting for the queue to drain");
    let drain_deadline = Instant::now() + options.quiesce_timeout;
    let drained = loop {
        match store.queue_stats().await {
            Ok(s) if s.visible + s.leased + s.delayed == 0 => break true,
            _ if Instant::now() >= drain_deadline || abort.load(Ordering::Relaxed) => break false,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    if !drained {
        say(options, &format!("the queue did not drain within {:?}", options.quiesce_timeout));
    }
    Ok(Driven { drained, recorder, coverage })
}

/// The run's metrics endpoints as a Prometheus file_sd file: one target group
/// per node, labelled with the node and the run, so a Prometheus started
/// beforehand finds each run's services by itself.
fn write_scrape_targets(path: &Path, options: &RunOptions, cluster: &Cluster, run_dir: &Path) -> anyhow::Result<()> {
    let run = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let group = |node: &str, url: &str| {
        let target = url.trim_start_matches("http://").trim_end_matches('/');
        serde_json::json!({"targets": [target], "labels": {"node": node, "run": run, "backend": options.backend.name()}})
    };
    let mut groups = vec![group("api", &cluster.api_url)];
    groups.extend(cluster.worker_admin.iter().map(|(node, url)| group(node, url)));
    if let Some(addr) = options.metrics_listen {
        groups.push(group("harness", &addr.to_string()));
    }
    // Written aside and renamed: Prometheus never reads half a file.
    let tmp = path.with_extension("tmp");
    write_json(&tmp, &groups)?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

async fn finish_final_state(store: &Store, run_dir: &Path, quiesced: bool, recorder: &Recorder) -> anyhow::Result<()> {
    recorder.finish().context("writing the history")?;
    let path = run_dir.join(FINAL_STATE_FILE);
    let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = JsonlWriter::new(std::io::BufWriter::new(file));
    store.final_state(|line| writer.write(&line)).await.context("reading the final state")?;
    let meta = Meta { quiesced, read_at_ns: recorder.elapsed_ns(), run_started_at_ms: recorder.started_at_ms() };
    writer.write(&FinalLine::Meta(meta))?;
    writer.flush()?;
    Ok(())
}

fn say(options: &RunOptions, line: &str) {
    if !options.quiet {
        eprintln!("{line}");
    }
}

/// Progress while the workload runs: a live bar on a terminal, a plain line
/// every 5 s otherwise (a log file or CI), nothing with `--quiet`. Besides the
/// client ops and the active faults it shows the redeliveries and the
/// duplicates the inbox absorbed so far, scraped from the workers' metrics
/// (`workers`: name and base URL); `?` until a worker has answered.
async fn progress(
    options: RunOptions,
    recorder: Arc<Recorder>,
    active: Arc<ActiveFaults>,
    workers: Vec<(String, String)>,
    deadline: Instant,
    abort: Arc<AtomicBool>,
) {
    use std::io::IsTerminal;
    if options.quiet {
        return;
    }
    // Stops scraping when this task is aborted (it is dropped with it).
    let deliveries = crate::worker_metrics::Watch::spawn(workers);
    let terminal = std::io::stderr().is_terminal();
    let started = Instant::now();
    let total_s = deadline.saturating_duration_since(started).as_secs().max(1);
    let bar = terminal.then(|| {
        let bar = indicatif::ProgressBar::new(total_s);
        let style = indicatif::ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} s  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar
    });
    let mut last = (started, 0u64);
    // A terminal redraws twice a second; a log gets a line every 5 s, often
    // enough to follow, rare enough to read.
    let mut tick = tokio::time::interval(if terminal { Duration::from_millis(500) } else { Duration::from_secs(5) });
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = Instant::now();
        if abort.load(Ordering::Relaxed) || now >= deadline {
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            if abort.load(Ordering::Relaxed) {
                return;
            }
        }
        let t = recorder.tally();
        let done = t.ok + t.fail + t.info;
        let rate = (done - last.1) as f64 / (now - last.0).as_secs_f64().max(0.001);
        last = (now, done);
        let faults: Vec<String> = active.list().iter().map(|(f, t)| format!("{f} {t}")).collect();
        let faults = if faults.is_empty() { "none".to_owned() } else { faults.join(", ") };
        let (redeliveries, absorbed) = match deliveries.total() {
            Some(c) => (c.redeliveries.to_string(), c.duplicates_absorbed.to_string()),
            None => ("?".to_owned(), "?".to_owned()),
        };
        let line = format!(
            "{rate:>7.1} ops/s  ok {}  fail {}  info {}  redelivered {redeliveries}  absorbed {absorbed}  faults: {faults}",
            t.ok, t.fail, t.info
        );
        match &bar {
            Some(bar) if now < deadline => {
                bar.set_position((now - started).as_secs().min(total_s));
                bar.set_message(line);
            }
            Some(_) => {}
            None => eprintln!(
                "[{:>3}s, {:>3}s left] {line}",
                (now - started).as_secs(),
                deadline.saturating_duration_since(now).as_secs()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{split_postgres_url, timestamp};

    #[test]
    fn postgres_urls_split_around_host_and_port() {
        assert_eq!(
            split_postgres_url("postgres://u:p@db.local:5433/app?sslmode=disable"),
            Some(("postgres://u:p@", "db.local:5433", "/app?sslmode=disable"))
        );
        assert_eq!(split_postgres_url("postgres://localhost/app"), Some(("postgres://", "localhost", "/app")));
        assert_eq!(split_postgres_url("postgres:///app?host=/tmp"), None);
    }

    #[test]
    fn timestamps_are_utc_civil_time() {
        assert_eq!(timestamp(0), "19700101T000000Z");
        assert_eq!(timestamp(1_795_964_645_123), "20261129T150405Z");
        assert_eq!(timestamp(951_782_400_000), "20000229T000000Z");
    }
}
