//! A system haunt did not build, described by a system file
//! (`haunt run --system FILE`, `docs/system-format.md`), as a [`System`]: its
//! nodes run as local processes with their placeholders filled, a fault proxy
//! stands in every `{addr:NAME}` link, the `[client]` section places orders,
//! and the `[final_state]` queries read the result.

pub mod client;
pub mod decl;
pub mod final_state;
pub mod spec;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use crate::backends::docker::{ContainerSpec, DockerBackend, IptablesLink, Peer};
use crate::backends::local::{LocalBackend, NodeSpec};
use crate::backends::proxy::FaultProxy;
use crate::core::admin::{Admin, AdminNode};
use crate::core::fault::Fault;
use crate::core::inflight::WorkProbe;
use crate::core::link::{SharedLink, SharedLossy, SharedSlow};
use crate::core::options::{BackendKind, RunOptions};
use crate::core::roles::{Backend, BoxFuture, Client, Node, Role};
use crate::core::system::{FinalSink, Surfaces, Switches, System};
use client::TemplateClient;
use final_state::Database;
use spec::{NodeFault, Placeholder, SystemSpec};

/// How long a node gets to become ready.
const READY_WAIT: Duration = Duration::from_secs(30);

/// Without a `quiet` or `pending` query: how long after the heal the system is
/// taken to have settled.
const SETTLE: Duration = Duration::from_secs(5);

/// A system file's system, laid out for one run.
#[derive(Debug)]
pub struct Foreign {
    spec: SystemSpec,
    nodes: Nodes,
    surfaces: Surfaces,
    client: Arc<TemplateClient>,
    database: Arc<Database>,
    /// Each node with a readiness probe, filled.
    ready: Vec<(Node, String)>,
    /// The nodes with an admin endpoint.
    admin: Option<Admin>,
    /// `final_state.quiet` as a URL, filled, with the client that asks it
    /// (built once: the run polls it until the system is quiet).
    quiet_url: Option<(String, reqwest::Client)>,
    /// When the system was first asked whether it is quiet (for [`SETTLE`]).
    asked: std::sync::Mutex<Option<Instant>>,
}

/// Where a system file's nodes run.
#[derive(Debug)]
enum Nodes {
    /// Local processes, each with its log in the run's `logs/`.
    Processes(Arc<LocalBackend>),
    /// Containers on the run's network; logs are copied to `logs` on demand.
    Containers(Arc<DockerBackend>, PathBuf),
}

impl Nodes {
    fn log(&self, node: &Node) -> PathBuf {
        match self {
            Nodes::Processes(b) => b.log_path(node),
            Nodes::Containers(b, logs) => {
                b.save_logs(logs);
                logs.join(format!("{}.log", node.name))
            }
        }
    }
}

/// Where the fault proxy of a node's `{addr:NAME}` listens.
enum Reach {
    /// On the host's loopback, for processes.
    Loopback,
    /// On the gateway of the run's network, for containers: the proxy
    /// forwards to the port NAME's container is published on.
    Gateway(std::net::IpAddr),
}

/// What the placeholders of one run stand for.
struct Fill {
    reach: Reach,
    /// `(caller, callee)` of each link between containers, in order.
    container_links: Vec<(String, String)>,
    haunt: PathBuf,
    dir: PathBuf,
    system_dir: PathBuf,
    ports: BTreeMap<String, u16>,
    /// The proxy of each link, by `(from, to)`.
    proxies: BTreeMap<(String, String), Arc<FaultProxy>>,
    /// The chosen `[[variant]]`'s values.
    vars: Vec<(String, String)>,
}

impl Fill {
    /// `text` with every placeholder but the order's filled; `from` is who
    /// reaches through `{addr:…}` (`None`: nobody may here).
    async fn fill(&mut self, text: &str, from: Option<&str>) -> anyhow::Result<String> {
        let mut out = String::new();
        for piece in spec::pieces(text).map_err(|e| anyhow::anyhow!(e))? {
            match piece {
                Ok(literal) => out.push_str(literal),
                Err(Placeholder::Haunt) => out.push_str(&self.haunt.to_string_lossy()),
                Err(Placeholder::Dir) => out.push_str(&self.dir.to_string_lossy()),
                Err(Placeholder::SystemDir) => out.push_str(&self.system_dir.to_string_lossy()),
                Err(Placeholder::Port(name)) => out.push_str(&self.ports[name].to_string()),
                Err(Placeholder::Addr(name)) => {
                    let from = from.context("{addr:…} where no link can stand")?;
                    let key = (from.to_owned(), name.to_owned());
                    let proxy = match self.proxies.get(&key) {
                        Some(p) => p.clone(),
                        None => {
                            // The client is the harness, on the host; a
                            // container reaches the host at its gateway.
                            let bind = match self.reach {
                                Reach::Gateway(gateway) if from != "client" => {
                                    self.container_links.push(key.clone());
                                    gateway
                                }
                                _ => std::net::Ipv4Addr::LOCALHOST.into(),
                            };
                            let target: SocketAddr = ([127, 0, 0, 1], self.ports[name]).into();
                            let p = Arc::new(
                                FaultProxy::start_on(bind, target)
                                    .await
                                    .with_context(|| format!("a fault proxy on {bind} for {from}<->{name}"))?,
                            );
                            self.proxies.insert(key, p.clone());
                            p
                        }
                    };
                    out.push_str(&proxy.addr().to_string());
                }
                // Filled per order by the client.
                Err(Placeholder::OrderId) => out.push_str("{order_id}"),
                Err(Placeholder::ItemId) => out.push_str("{item_id}"),
                Err(Placeholder::Qty) => out.push_str("{qty}"),
                Err(Placeholder::N) => anyhow::bail!("{{n}} outside a node with count"),
                Err(Placeholder::Var(name)) => {
                    let (_, value) = self
                        .vars
                        .iter()
                        .find(|(k, _)| k == name)
                        .with_context(|| format!("{{var:{name}}}: the run's variant gives it no value"))?;
                    out.push_str(value);
                }
            }
        }
        Ok(out)
    }
}

/// The strings of the file that may hold placeholders: the nodes' commands
/// and env and the client's URL (where links stand), and, with `probes`, the
/// readiness probes, admin URLs, aim probes and the database URL too.
fn texts(spec: &SystemSpec, probes: bool) -> Vec<&str> {
    let mut texts: Vec<&str> = vec![&spec.client.url];
    for node in &spec.nodes {
        texts.extend(node.command.iter().map(String::as_str));
        texts.extend(node.env.iter().map(|(_, v)| v.as_str()));
        if probes {
            texts.extend(node.ready.as_deref());
            texts.extend(node.admin.as_deref());
            texts.extend(node.aim.as_deref());
        }
    }
    if probes {
        texts.push(&spec.final_state.database);
        texts.extend(spec.final_state.quiet.as_deref().filter(|q| q.starts_with("http://")));
    }
    texts
}

/// Every `{port:NAME}` and `{addr:NAME}` name in the file.
fn port_names(spec: &SystemSpec) -> Vec<String> {
    let mut names: Vec<String> = texts(spec, true)
        .into_iter()
        .flat_map(|t| spec::pieces(t).unwrap_or_default())
        .filter_map(|p| match p {
            Err(Placeholder::Port(n) | Placeholder::Addr(n)) => Some(n.to_owned()),
            _ => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What a run's options must agree with in a system file: every node can run
/// on the backend, and the faults are ones the system can take. Each error
/// names the file, and the node or the flag.
pub fn check_options(spec: &SystemSpec, options: &RunOptions) -> anyhow::Result<()> {
    for node in &spec.nodes {
        match (&node.image, options.backend) {
            // A running container is adopted whatever the backend.
            _ if node.container.is_some() => {}
            (None, BackendKind::Docker) => anyhow::bail!(
                "{}: node {} has no image: with --backend docker every node runs as a container (image = …)",
                spec.file.display(),
                node.name
            ),
            (Some(_), BackendKind::Local) => anyhow::bail!(
                "{}: node {} runs from an image: give --backend docker, or a command instead",
                spec.file.display(),
                node.name
            ),
            _ => {}
        }
    }
    let allowed = faults_allowed(spec);
    if let Some(f) = options.faults.iter().find(|f| !allowed.contains(f)) {
        let allowed: Vec<&str> = allowed.iter().map(|f| f.name()).collect();
        anyhow::bail!(
            "--nemesis {f}: {} cannot take it (it allows: {}; kill and pause are given per node in `faults`, \
             partition and delay need a link through {{addr:NAME}}, ack-loss, db-error and clock-skew a node that lists \
             them in `hooks`)",
            spec.file.display(),
            if allowed.is_empty() { "none".to_owned() } else { allowed.join(", ") }
        );
    }
    Ok(())
}

/// The faults a system file's system can take: kill and pause where a node
/// allows them, partition and delay where a link passes through `{addr:…}`.
pub fn faults_allowed(spec: &SystemSpec) -> Vec<Fault> {
    let takes = |f: NodeFault| spec.nodes.iter().any(|n| n.faults.contains(&f));
    let links = texts(spec, false)
        .into_iter()
        .any(|t| spec::pieces(t).unwrap_or_default().iter().any(|p| matches!(p, Err(Placeholder::Addr(_)))));
    let mut out = Vec::new();
    if takes(NodeFault::Kill) {
        out.push(Fault::Kill);
    }
    if takes(NodeFault::Pause) {
        out.push(Fault::Pause);
    }
    // Links between containers: `links`, or `{addr:…}` in an image node's strings.
    let container_links = spec.nodes.iter().any(|n| {
        !n.links.is_empty()
            || (n.image.is_some()
                && n.command.iter().chain(n.env.iter().map(|(_, v)| v)).any(|s| {
                    spec::pieces(s).unwrap_or_default().iter().any(|p| matches!(p, Err(Placeholder::Addr(_))))
                }))
    });
    if links {
        out.extend([Fault::Partition, Fault::Delay]);
    } else if container_links {
        out.push(Fault::Partition);
    }
    if container_links {
        out.push(Fault::Loss);
    }
    out.extend(spec::HOOKS.into_iter().filter(|f| spec.nodes.iter().any(|n| n.hooks.contains(f))));
    out
}

impl Foreign {
    /// Lays the system out in `run_dir`: a scratch directory (`{dir}`), a port
    /// per name, a proxy per link, the nodes (not started).
    /// `haunt`: the executable that `{haunt}` names.
    ///
    /// With `docker`, every node runs from its image as a container on a
    /// private network of the run, each port published on the host's
    /// loopback: `{addr:NAME}` in a node is a fault proxy on the network's
    /// gateway (cut and slowed there, made lossy by iptables in the caller's
    /// namespace), the client's a fault proxy on the loopback, each
    /// forwarding to NAME's published port.
    pub async fn create(
        spec: SystemSpec,
        run_dir: &Path,
        haunt: &Path,
        request_timeout: Duration,
        docker: Option<&crate::core::options::DockerOptions>,
    ) -> anyhow::Result<Foreign> {
        // Containers someone else started: haunt faults them where they are.
        let adopted = spec.nodes.iter().all(|n| n.container.is_some());
        let tools_image = docker.map_or(crate::backends::docker::TOOLS_IMAGE, |d| d.image.as_str());
        if docker.is_some() || adopted {
            crate::backends::docker::ensure_engine().await?;
            // The tools image cuts the links between containers.
            for image in spec.nodes.iter().filter_map(|n| n.image.as_deref()).chain([tools_image]) {
                crate::backends::docker::ensure_image(image).await?;
            }
        }
        let mut rng = haunt_store::Rng::from_entropy();
        let run_id = format!("{:08x}", rng.next_u64() as u32);
        if docker.is_some() && !adopted {
            // Always said: the run id is how `haunt clean` and a user find them.
            eprintln!("starting containers haunt-{run_id}-*");
        }
        let dir = std::path::absolute(run_dir.join("scratch"))?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let system_dir = std::path::absolute(&spec.system_dir)?;
        // Held until every proxy listens, so that no two names share a port.
        let (ports, held) = ports(&spec, adopted).await?;
        // Containers the run starts: their network first, so that their
        // proxies can listen where they reach the host.
        let network = match docker {
            Some(options) if !adopted => {
                let mount = options.mount_exe.then(|| haunt.to_owned());
                Some(DockerBackend::with_network(&run_id, mount, &options.image).await?)
            }
            _ => None,
        };
        let reach = match &network {
            Some(backend) => Reach::Gateway(backend.network_gateway().await?.into()),
            None => Reach::Loopback,
        };
        // In a container, `{haunt}` is the image's own.
        let inside = if docker.is_some() { PathBuf::from("haunt") } else { haunt.to_owned() };
        let mut fill = Fill {
            reach,
            container_links: Vec::new(),
            haunt: inside,
            dir,
            system_dir: system_dir.clone(),
            ports,
            proxies: BTreeMap::new(),
            vars: spec.variant.as_ref().map(|v| v.vars.clone()).unwrap_or_default(),
        };
        let token = format!("{:016x}", rng.next_u64());
        let declared = Declared::fill(&spec, &mut fill, &system_dir, &token).await?;
        let mut client_decl = spec.client.clone();
        client_decl.url = fill.fill(&spec.client.url, Some("client")).await?;
        let database = Arc::new(Database::new(fill.fill(&spec.final_state.database, None).await?));
        let mut probes: Vec<(String, Arc<dyn WorkProbe>)> = Vec::new();
        for decl in spec.nodes.iter().filter(|d| d.aim.is_some()) {
            let probe = fill.fill(decl.aim.as_deref().unwrap_or_default(), None).await?;
            probes.push((decl.name.clone(), Arc::new(Probe::new(&decl.name, probe, database.clone())?)));
        }
        // Every proxy listens: the nodes may bind their ports.
        drop(held);

        let proxies: Vec<(String, Arc<FaultProxy>)> =
            fill.proxies.iter().map(|((from, to), p)| (format!("{from}<->{to}"), p.clone())).collect();
        let mut links: Vec<(String, SharedLink)> =
            proxies.iter().map(|(n, p)| (n.clone(), p.clone() as SharedLink)).collect();
        let Declared { specs, containers, adopt, ready, node_faults, admin } = declared;
        let admin = (!admin.is_empty()).then(|| Admin::new(token, admin)).transpose()?;
        let switches = admin.as_ref().map(|all| switches(&spec, all));
        let logs = run_dir.join("logs");
        // Links between containers: lossy (loss) by iptables in the caller's
        // namespace; an adopted container's cut (partition) by iptables too,
        // as it has no proxy in its path.
        let (nodes, backend, lossy) = match network {
            _ if adopted => {
                let (nodes, backend, lossy) = adopt_containers(&spec, &run_id, adopt, tools_image, logs).await?;
                links.extend(lossy.iter().map(|(name, link)| (name.clone(), link.clone() as SharedLink)));
                (nodes, backend, lossy)
            }
            None => {
                let processes = Arc::new(LocalBackend::new(PathBuf::new(), logs, Vec::new(), specs));
                (Nodes::Processes(processes.clone()), processes as Arc<dyn Backend>, Vec::new())
            }
            Some(network) => {
                let through: Vec<(String, String, u16)> = fill
                    .container_links
                    .iter()
                    .map(|(from, to)| {
                        (from.clone(), to.clone(), fill.proxies[&(from.clone(), to.clone())].addr().port())
                    })
                    .collect();
                start_containers(network, containers, &through, logs).await?
            }
        };
        let slowable = proxies.into_iter().map(|(n, p)| (n, p as SharedSlow)).collect();
        let lossy = lossy.into_iter().map(|(n, l)| (n, l as SharedLossy)).collect();
        let client = Arc::new(TemplateClient::new(client_decl, request_timeout)?);
        // The node the client's URL calls: its kills and pauses can be aimed
        // from the client's side.
        let called = spec::pieces(&spec.client.url).unwrap_or_default().into_iter().find_map(|p| match p {
            Err(Placeholder::Addr(name)) => Some(name.to_owned()),
            _ => None,
        });
        let in_flight = called.map(|node| (node, client.in_flight())).into_iter().collect();
        let surfaces = Surfaces { backend, node_faults, links, slowable, lossy, switches, in_flight, probes };
        let quiet_url = match spec.final_state.quiet.as_deref().filter(|q| q.starts_with("http://")) {
            Some(url) => {
                let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
                Some((fill.fill(url, None).await?, http))
            }
            None => None,
        };
        let asked = std::sync::Mutex::new(None);
        Ok(Foreign { spec, nodes, surfaces, client, database, ready, admin, quiet_url, asked })
    }

    /// Why `node` is not ready, with what a user needs to fix it.
    fn not_ready(&self, node: &Node, probe: &str, last: &str) -> anyhow::Error {
        self.not_answering(node, &format!("node {} never became ready: {probe}", node.name), last)
    }

    /// `what` (naming the node and what it was asked) did not answer: how
    /// long was waited or that the process exited, its command and the last
    /// lines of its log.
    fn not_answering(&self, node: &Node, what: &str, last: &str) -> anyhow::Error {
        let decl = self.spec.nodes.iter().find(|d| d.name == node.name);
        let command = decl.map(|d| d.command.join(" ")).unwrap_or_default();
        let log = self.nodes.log(node);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n    ");
        let when = if self.surfaces.backend.is_running(node) {
            format!("within {} s (last: {last}; the process is running)", READY_WAIT.as_secs())
        } else {
            format!("before its process exited (last: {last})")
        };
        anyhow::anyhow!(
            "{what} did not answer {when}\n  command: {command}\n  the last lines of {}:\n    {tail}",
            log.display()
        )
    }
}

/// A port for each name `{port:…}` or `{addr:…}` uses: a free one on
/// 127.0.0.1, held open (the second value) until every proxy listens, or an
/// adopted container's published port.
async fn ports(
    spec: &SystemSpec,
    adopted: bool,
) -> anyhow::Result<(BTreeMap<String, u16>, Vec<std::net::TcpListener>)> {
    let mut held = Vec::new();
    let mut ports = BTreeMap::new();
    for name in port_names(spec) {
        if adopted {
            let decl = spec.nodes.iter().find(|n| n.name == name).context("a port of no node")?;
            let inner = decl.port.with_context(|| {
                format!("node {name}: {{port:{name}}} needs `port`, the container's port it is published from")
            })?;
            ports.insert(
                name.clone(),
                crate::backends::docker::host_port(decl.container.as_deref().unwrap_or(""), inner).await?,
            );
            continue;
        }
        // A container's port is bound by the engine as it starts, a process's
        // by the process, and again after each restart: below the ephemeral
        // range, where no outgoing connection takes it meanwhile.
        let (port, listener) = crate::systems::brokers::publishable_port()?;
        ports.insert(name, port);
        held.push(listener);
    }
    Ok((ports, held))
}

/// The nodes of a system file, their placeholders filled: processes to
/// start, containers to start or containers to adopt, by how each is given.
struct Declared {
    specs: Vec<NodeSpec>,
    containers: Vec<ContainerSpec>,
    adopt: Vec<(Node, String)>,
    /// Each node's readiness probe.
    ready: Vec<(Node, String)>,
    node_faults: Vec<(Fault, Vec<Node>)>,
    /// Each node's admin endpoint, its URL filled.
    admin: Vec<AdminNode>,
}

impl Declared {
    /// `token`: what each node with an admin endpoint gets in
    /// `HAUNT_ADMIN_TOKEN`.
    async fn fill(spec: &SystemSpec, fill: &mut Fill, system_dir: &Path, token: &str) -> anyhow::Result<Declared> {
        let mut out = Declared {
            specs: Vec::new(),
            containers: Vec::new(),
            adopt: Vec::new(),
            ready: Vec::new(),
            node_faults: vec![(Fault::Kill, Vec::new()), (Fault::Pause, Vec::new())],
            admin: Vec::new(),
        };
        for decl in &spec.nodes {
            // The node the final state is read from stays up until it is read.
            let holds_state = spec::pieces(&spec.final_state.database)
                .unwrap_or_default()
                .iter()
                .any(|p| matches!(p, Err(Placeholder::Port(n)) if *n == decl.name));
            let role = if holds_state { Role::Database } else { Role::Service };
            let node = Node { name: decl.name.clone(), role };
            let mut command = Vec::new();
            for arg in &decl.command {
                command.push(fill.fill(arg, Some(&decl.name)).await?);
            }
            let mut env = Vec::new();
            for (k, v) in &decl.env {
                env.push((k.clone(), fill.fill(v, Some(&decl.name)).await?));
            }
            if let Some(probe) = &decl.ready {
                out.ready.push((node.clone(), fill.fill(probe, None).await?));
            }
            if let Some(url) = &decl.admin {
                let base = fill.fill(url, None).await?.trim_end_matches('/').to_owned();
                out.admin.push(AdminNode { name: decl.name.clone(), base, points: decl.points.clone() });
                env.push((spec::TOKEN_VAR.to_owned(), token.to_owned()));
            }
            for (fault, nodes) in &mut out.node_faults {
                let takes = match fault {
                    Fault::Kill => decl.faults.contains(&NodeFault::Kill),
                    _ => decl.faults.contains(&NodeFault::Pause),
                };
                if takes {
                    nodes.push(node.clone());
                }
            }
            if let Some(container) = &decl.container {
                out.adopt.push((node, container.clone()));
            } else if let Some(image) = &decl.image {
                // Published on the host at the node's own port: `{port:NAME}`
                // means the same inside and out.
                let host = fill.ports.get(&decl.name).copied();
                let inner = decl.port.or(host);
                out.containers.push(ContainerSpec {
                    node,
                    image: image.clone(),
                    args: command,
                    env,
                    ports: host.zip(inner).into_iter().collect(),
                    mounts: Vec::new(),
                    workdir: None,
                    health_check: false,
                });
            } else {
                // A program given by a relative path is the system's, not the harness's.
                let program = PathBuf::from(&command[0]);
                let program =
                    if command[0].contains('/') && program.is_relative() { system_dir.join(program) } else { program };
                out.specs.push(NodeSpec {
                    node,
                    args: command[1..].to_vec(),
                    program: Some(program),
                    env,
                    cwd: Some(system_dir.to_owned()),
                    ready: None,
                });
            }
        }
        Ok(out)
    }
}

/// A node's `aim`: whether it holds work now, by an HTTP GET (2xx: yes) or
/// an SQL query on the system's database (a true or non-zero value: yes).
#[derive(Debug)]
enum Probe {
    Http { http: reqwest::Client, url: String },
    Sql { node: String, sql: String, database: Arc<Database> },
}

impl Probe {
    fn new(node: &str, probe: String, database: Arc<Database>) -> anyhow::Result<Probe> {
        Ok(if probe.starts_with("http://") {
            // Short: a probe answers within the aim's wait or not at all.
            let http = reqwest::Client::builder().timeout(Duration::from_millis(200)).build()?;
            Probe::Http { http, url: probe }
        } else {
            Probe::Sql { node: node.to_owned(), sql: probe, database }
        })
    }
}

impl WorkProbe for Probe {
    fn holds_work(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(async move {
            match self {
                Probe::Http { http, url } => Ok(http.get(url).send().await?.status().is_success()),
                Probe::Sql { node, sql, database } => database.truth(&format!("node {node}'s aim"), sql).await,
            }
        })
    }
}

/// The admin endpoints of a system file's nodes, `all`: each hook's nodes,
/// and the nodes with hold points.
fn switches(spec: &SystemSpec, all: &Admin) -> Switches {
    let takes = |fault: Fault| all.only(|a| spec.nodes.iter().any(|d| d.name == a.name && d.hooks.contains(&fault)));
    let by_fault = spec::HOOKS.into_iter().map(|f| (f, takes(f))).collect();
    Switches { by_fault, holds: all.only(|a| !a.points.is_empty()) }
}

impl Foreign {
    /// Whether each node with an admin endpoint offers the hold points and
    /// the hooks it declares: its `GET /admin/points` (waited for, as a
    /// readiness probe is) and `GET /admin/faults`. Each error names the
    /// node and the point or hook.
    async fn check_admin(&self, admin: &Admin) -> anyhow::Result<()> {
        for node in &admin.nodes {
            let decl = self.spec.nodes.iter().find(|d| d.name == node.name).context("an admin of no node")?;
            // Waited for as a readiness probe is, and not past its process's exit.
            let process = self.surfaces.backend.nodes().into_iter().find(|n| n.name == node.name);
            let exited = || process.as_ref().is_some_and(|n| !self.surfaces.backend.is_running(n));
            let deadline = Instant::now() + READY_WAIT;
            let offered = loop {
                match admin.get(&node.name, "/admin/points").await {
                    Ok(answer) => break answer,
                    Err(e) if Instant::now() >= deadline || exited() => {
                        let what = format!(
                            "node {}: its admin endpoint {} (see docs/admin.md): GET /admin/points",
                            node.name, node.base
                        );
                        return Err(match &process {
                            Some(process) => self.not_answering(process, &what, &format!("{e:#}")),
                            None => anyhow::anyhow!("{what} did not answer within {} s ({e:#})", READY_WAIT.as_secs()),
                        });
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            };
            let offered: Vec<&str> =
                offered["points"].as_array().into_iter().flatten().filter_map(|p| p.as_str()).collect();
            if let Some(missing) = node.points.iter().find(|p| !offered.contains(&p.as_str())) {
                anyhow::bail!(
                    "node {}: the system file declares hold point {missing:?}, which its admin endpoint does not offer \
                     (GET {}/admin/points: {})",
                    node.name,
                    node.base,
                    if offered.is_empty() { "none".to_owned() } else { offered.join(", ") }
                );
            }
            if decl.hooks.is_empty() {
                continue;
            }
            let switches = admin.get(&node.name, "/admin/faults").await?;
            if let Some(&hook) = decl.hooks.iter().find(|&&h| switches.get(spec::hook_field(h)).is_none()) {
                anyhow::bail!(
                    "node {}: the system file declares hook {hook}, but GET {}/admin/faults has no {} ({switches})",
                    node.name,
                    node.base,
                    spec::hook_field(hook)
                );
            }
        }
        Ok(())
    }
}

/// What a system's nodes run on, and its links between containers.
type Started = (Nodes, Arc<dyn Backend>, Vec<(String, Arc<IptablesLink>)>);

/// Running containers someone else started, each link of theirs lossy.
async fn adopt_containers(
    spec: &SystemSpec,
    run_id: &str,
    adopt: Vec<(Node, String)>,
    tools_image: &str,
    logs: PathBuf,
) -> anyhow::Result<Started> {
    let by_name: BTreeMap<String, Node> = adopt.iter().map(|(n, _)| (n.name.clone(), n.clone())).collect();
    let docker = Arc::new(DockerBackend::adopt(run_id, adopt, tools_image).await?);
    let mut lossy = Vec::new();
    for decl in &spec.nodes {
        for peer in &decl.links {
            let (from, to) = (by_name[&decl.name].clone(), by_name[peer].clone());
            let link = Arc::new(IptablesLink::new(docker.clone(), from, Peer::Node(to)));
            lossy.push((format!("{}<->{peer}", decl.name), link));
        }
    }
    Ok((Nodes::Containers(docker.clone(), logs), docker, lossy))
}

/// The nodes as containers of the run, on its network (`network`). Each of
/// `links`, `(caller, callee, port)`, runs through the harness's fault proxy
/// on `port` of the network's gateway, and is made lossy by iptables in the
/// caller's namespace.
async fn start_containers(
    mut network: DockerBackend,
    containers: Vec<ContainerSpec>,
    links: &[(String, String, u16)],
    logs: PathBuf,
) -> anyhow::Result<Started> {
    let by_name: BTreeMap<String, Node> = containers.iter().map(|c| (c.node.name.clone(), c.node.clone())).collect();
    network.add_containers(containers).await?;
    let docker = Arc::new(network);
    let mut lossy = Vec::new();
    for (from, to, port) in links {
        let link = Arc::new(IptablesLink::new(docker.clone(), by_name[from].clone(), Peer::Harness { port: *port }));
        lossy.push((format!("{from}<->{to}"), link));
    }
    Ok((Nodes::Containers(docker.clone(), logs), docker, lossy))
}

impl System for Foreign {
    fn surfaces(&self) -> &Surfaces {
        &self.surfaces
    }

    fn client(&self) -> Arc<dyn Client> {
        self.client.clone()
    }

    fn ready(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            for (node, url) in &self.ready {
                let alive = || self.surfaces.backend.is_running(node);
                if let Err(last) = crate::core::system::wait_ready(url, READY_WAIT, alive).await {
                    return Err(self.not_ready(node, url, &last));
                }
            }
            match &self.admin {
                Some(admin) => self.check_admin(admin).await,
                None => Ok(()),
            }
        })
    }

    fn is_quiet(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(async move {
            if let Some((url, http)) = &self.quiet_url {
                // A node that does not answer (restarting, cut off) is not quiet.
                let answer = http.get(url).send().await;
                return Ok(answer.is_ok_and(|r| r.status().is_success()));
            }
            if let Some(quiet) = self.database.is_quiet(&self.spec.final_state).await? {
                return Ok(quiet);
            }
            let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
            let first = *asked.get_or_insert_with(Instant::now);
            Ok(first.elapsed() >= SETTLE)
        })
    }

    fn read_final_state<'a>(&'a self, sink: &'a mut FinalSink<'_>) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(self.database.read(&self.spec.final_state, sink))
    }

    fn has_ledger(&self) -> bool {
        self.spec.final_state.applied.is_some()
    }

    fn database(&self) -> String {
        self.database.url().to_owned()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.database.close())
    }
}
