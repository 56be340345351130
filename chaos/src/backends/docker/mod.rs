//! The Docker backend: nodes as containers, node faults by kill, start, pause
//! and unpause, link faults by iptables rules in a container's network
//! namespace.
//!
//! It speaks to the engine through the Docker API with bollard, the client
//! testcontainers is built on, so a test's own testcontainers and haunt's
//! backend are one way to Docker (no `docker` command line anywhere). A
//! backend either creates its containers ([`DockerBackend::create`]: named
//! `haunt-<run id>-…` on a network of its own, ports on 127.0.0.1 only) or
//! adopts containers someone else started ([`DockerBackend::adopt`]: a test's
//! testcontainers, by id), which it faults but never removes.
//!
//! Links are cut from a short-lived helper container that joins the target's
//! network namespace with `NET_ADMIN` (the tools image, haunt's own, carries
//! iptables), so the target's image needs neither iptables nor privileges, and
//! a paused target can be healed.
//!
//! Everything created is labelled [`RUN_LABEL`]`=<run id>`. Dropping the
//! backend removes it, which covers errors, Ctrl-C and panics; [`clean`]
//! (`haunt clean`) removes what a harness killed outright left behind.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
pub use bollard;
use bollard::Docker;
use bollard::errors::Error as ApiError;
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HealthConfig, HealthStatusEnum, HostConfig, NetworkCreateRequest,
    NetworkingConfig, PortBinding,
};
use bollard::query_parameters::{CreateContainerOptions, KillContainerOptions, StopContainerOptions};
use tokio::time::Instant;

use crate::core::roles::{Backend, BoxFuture, Node, Role};

mod engine;
mod link;
use engine::{Helper, logs, remove_labelled};
pub use engine::{clean, has_image, leftovers, leftovers_of_run};
pub use link::{IptablesLink, Peer};

/// The label on every container and network of a run; its value is the run id.
pub const RUN_LABEL: &str = "io.haunt.run";

/// The image whose iptables, bash and timeout the link helpers use.
pub const TOOLS_IMAGE: &str = "haunt:latest";

/// The runs of this process whose containers exist, for [`remove_live`].
static LIVE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Removes the containers of every run of this process at once: for a second
/// Ctrl-C, which exits without unwinding.
pub fn remove_live() {
    let runs = std::mem::take(&mut *LIVE.lock().unwrap_or_else(|p| p.into_inner()));
    for run_id in runs {
        let _ = remove_labelled(&format!("{RUN_LABEL}={run_id}"));
    }
}

/// A connection to the engine `DOCKER_HOST` names (the local socket by
/// default), at the API version both ends speak.
pub async fn connect() -> anyhow::Result<Docker> {
    const HELP: &str = "no Docker engine answers: start one (scripts/docker installs and starts it on Debian as root)";
    let docker = Docker::connect_with_defaults().context(HELP)?;
    docker.negotiate_version().await.context(HELP)
}

/// Runs `work` on a connection and a runtime of its own, on a thread of its
/// own: for `Drop`, `haunt clean` and the trait's synchronous methods, which
/// may run inside or outside a runtime (a connection belongs to the runtime
/// that opened it, so none is shared).
fn blocking<T, F, Fut>(work: F) -> anyhow::Result<T>
where
    T: Send,
    F: FnOnce(Docker) -> Fut + Send,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                runtime.block_on(async { work(connect().await?).await })
            })
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the Docker call panicked")))
    })
}

/// The engine's own words for an error (bollard wraps them).
fn said(e: &ApiError) -> String {
    match e {
        ApiError::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Whether an error is the engine's 404 or 409 for a container that is gone
/// or not running: what a kill or a heal of such a container wants anyway.
fn not_running(e: &ApiError) -> bool {
    matches!(e, ApiError::DockerResponseServerError { status_code: 404, .. }) || said(e).contains("is not running")
}

/// Fails with directions when no engine answers.
pub async fn ensure_engine() -> anyhow::Result<()> {
    connect().await.map(drop)
}

/// Fails with directions when an image is missing.
pub async fn ensure_image(image: &str) -> anyhow::Result<()> {
    connect()
        .await?
        .inspect_image(image)
        .await
        .map_err(|e| anyhow::anyhow!("{}", said(&e)))
        .with_context(|| format!("image {image} is missing: build it with scripts/images"))?;
    Ok(())
}

/// The port on the host that `port` (TCP) of a running container is
/// published on, preferring an IPv4 binding.
pub async fn host_port(container: &str, port: u16) -> anyhow::Result<u16> {
    let inspect = connect()
        .await?
        .inspect_container(container, None)
        .await
        .map_err(|e| anyhow::anyhow!("no container {container}: {}", said(&e)))?;
    let ports = inspect.network_settings.and_then(|s| s.ports).unwrap_or_default();
    let bindings = ports.get(&format!("{port}/tcp")).cloned().flatten().unwrap_or_default();
    let mut found: Vec<(bool, u16)> = bindings
        .iter()
        .filter_map(|b| {
            Some((b.host_ip.as_deref().is_some_and(|ip| ip.contains(':')), b.host_port.as_deref()?.parse().ok()?))
        })
        .collect();
    found.sort();
    found.first().map(|(_, p)| *p).with_context(|| {
        format!("container {container} publishes no host port for {port}/tcp (publish it, e.g. with_mapped_port)")
    })
}

/// How one node runs as a container.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    pub node: Node,
    pub image: String,
    /// Arguments after the image's entrypoint.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `(port on 127.0.0.1, port in the container)`.
    pub ports: Vec<(u16, u16)>,
    /// Host directories mounted at the same path in the container (a
    /// broker's configuration and data, in the run directory).
    pub mounts: Vec<PathBuf>,
    /// The working directory in the container (default: the image's).
    pub workdir: Option<PathBuf>,
    /// Keep the image's `HEALTHCHECK`, for a node the harness waits healthy
    /// ([`DockerBackend::wait_healthy`]) and never pauses. Off otherwise:
    /// the engine runs a health check as an exec into the container, and an
    /// exec that starts as the container freezes is caught in the frozen
    /// cgroup, where it holds the engine's calls for that container
    /// (inspect, unpause) until something thaws it; a pause fault was then
    /// left in place and every call of the heal timed out (the suite,
    /// 2026-12-05). The harness has readiness checks of its own.
    pub health_check: bool,
}

impl ContainerSpec {
    /// `node` from `image` with `args`, one port published, nothing else.
    pub fn new(node: Node, image: &str, args: Vec<String>, port: (u16, u16)) -> ContainerSpec {
        ContainerSpec {
            node,
            image: image.to_owned(),
            args,
            env: Vec::new(),
            ports: vec![port],
            mounts: Vec::new(),
            workdir: None,
            health_check: false,
        }
    }
}

/// One node and the container that runs it (a name or an id).
#[derive(Debug, Clone)]
struct Member {
    node: Node,
    container: String,
}

#[derive(Debug)]
pub struct DockerBackend {
    docker: Docker,
    run_id: String,
    /// The network it created, if it created its containers.
    network: Option<String>,
    /// Mounted over the image's `haunt`, so the containers run the harness's own code.
    mount_exe: Option<PathBuf>,
    /// The containers it creates (none when it adopted them).
    specs: Vec<ContainerSpec>,
    members: Vec<Member>,
    tools_image: String,
    removed: AtomicBool,
    /// The full id of each container it paused, by container: what
    /// [`thaw`] needs when the engine no longer answers for it.
    paused_ids: std::sync::Mutex<HashMap<String, String>>,
}

/// How long the engine may take to unpause a container before the harness
/// helps it through the container's cgroup ([`unstick`]).
const UNPAUSE_WAIT: Duration = Duration::from_secs(20);

/// Freezes or thaws the freezer cgroup of the container `id` through the
/// cgroup file system of this host (cgroup v1's freezer, or v2's
/// `cgroup.freeze` under the cgroupfs or the systemd driver), behind the
/// engine's back. Needs the engine on this host, and root. Returns the file
/// written.
fn set_frozen(id: &str, frozen: bool) -> anyhow::Result<PathBuf> {
    let candidates = [
        (PathBuf::from(format!("/sys/fs/cgroup/freezer/docker/{id}/freezer.state")), ["THAWED", "FROZEN"]),
        (PathBuf::from(format!("/sys/fs/cgroup/docker/{id}/cgroup.freeze")), ["0", "1"]),
        (PathBuf::from(format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/cgroup.freeze")), ["0", "1"]),
    ];
    for (path, values) in candidates {
        if path.exists() {
            let value = values[usize::from(frozen)];
            std::fs::write(&path, value).with_context(|| format!("writing {value} to {}", path.display()))?;
            return Ok(path);
        }
    }
    anyhow::bail!("no freezer cgroup of container {id} on this host (is the engine remote, or the cgroup elsewhere?)")
}

/// Unpauses `name` (not paused already is done, and so is gone or not
/// running with `gone_is_done`); an engine that does not answer within
/// [`UNPAUSE_WAIT`] is helped with [`unstick`] when the container's id is
/// known.
async fn unpause(docker: &Docker, name: &str, id: Option<&str>, gone_is_done: bool) -> anyhow::Result<()> {
    match tokio::time::timeout(UNPAUSE_WAIT, docker.unpause_container(name)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if said(&e).contains("is not paused") || (gone_is_done && not_running(&e)) => Ok(()),
        Ok(Err(e)) => anyhow::bail!("{}", said(&e)),
        Err(_) => {
            let id = id.with_context(|| format!("the engine did not answer within {UNPAUSE_WAIT:?}"))?;
            let path = unstick(docker, name, id).await?;
            eprintln!(
                "haunt: the engine did not unpause {name} within {UNPAUSE_WAIT:?}; it was helped through {}",
                path.display()
            );
            Ok(())
        }
    }
}

/// Helps an engine that hangs on the paused container `id` (its `name`):
/// an exec that started as the container froze (the engine's own health
/// check) is caught in the frozen cgroup, and every call for that
/// container, an unpause among them, waits on it (seen in the suite,
/// 2026-12-05, Docker 20.10 with containerd 1.6: the pause was left in
/// place). Thawed behind the engine's back, the exec ends and the engine
/// answers again, but still calls the container paused, and refuses to
/// unpause what runc finds running; so once it answers, the cgroup is
/// frozen again and the engine asked to unpause it, as it would have.
async fn unstick(docker: &Docker, name: &str, id: &str) -> anyhow::Result<PathBuf> {
    let path = set_frozen(id, false)?;
    let deadline = tokio::time::Instant::now() + UNPAUSE_WAIT;
    // The engine answers again once the exec it waited on has ended.
    while tokio::time::timeout(Duration::from_secs(2), docker.inspect_container(name, None)).await.is_err() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "thawed ({}), but the engine still hangs",
            path.display()
        );
    }
    set_frozen(id, true)?;
    match tokio::time::timeout(UNPAUSE_WAIT, docker.unpause_container(name)).await {
        Ok(Ok(())) => Ok(path),
        Ok(Err(e)) => {
            // Thawed again, whatever the engine says: nothing stays frozen.
            let _ = set_frozen(id, false);
            anyhow::bail!("thawed ({}), but the engine refused the unpause: {}", path.display(), said(&e))
        }
        Err(_) => {
            let _ = set_frozen(id, false);
            anyhow::bail!("thawed ({}), but the engine does not answer the unpause", path.display())
        }
    }
}

impl DockerBackend {
    /// Creates the network and every container (not started). On an error,
    /// whatever was created is removed again.
    pub async fn create(
        run_id: &str,
        mount_exe: Option<PathBuf>,
        specs: Vec<ContainerSpec>,
        tools_image: &str,
    ) -> anyhow::Result<DockerBackend> {
        let mut backend = DockerBackend::with_network(run_id, mount_exe, tools_image).await?;
        backend.add_containers(specs).await?;
        Ok(backend)
    }

    /// Creates the run's network, with no container on it yet: what a node
    /// will reach the host at ([`DockerBackend::network_gateway`]) is then
    /// known before its command is written. Dropped, it removes the network.
    pub async fn with_network(
        run_id: &str,
        mount_exe: Option<PathBuf>,
        tools_image: &str,
    ) -> anyhow::Result<DockerBackend> {
        let network = format!("haunt-{run_id}");
        let backend = DockerBackend {
            docker: connect().await?,
            run_id: run_id.to_owned(),
            network: Some(network.clone()),
            mount_exe,
            specs: Vec::new(),
            members: Vec::new(),
            tools_image: tools_image.to_owned(),
            removed: AtomicBool::new(false),
            paused_ids: Default::default(),
        };
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).push(run_id.to_owned());
        let request =
            NetworkCreateRequest { name: network.clone(), labels: Some(backend.labels(None)), ..Default::default() };
        backend
            .docker
            .create_network(request)
            .await
            .map_err(|e| anyhow::anyhow!("creating network {network}: {}", said(&e)))?;
        Ok(backend)
    }

    /// Creates a container (not started) on the run's network for each of `specs`.
    pub async fn add_containers(&mut self, specs: Vec<ContainerSpec>) -> anyhow::Result<()> {
        let network = self.network.clone().context("adopted containers are not created")?;
        for spec in specs {
            self.members.push(Member { node: spec.node.clone(), container: format!("{network}-{}", spec.node.name) });
            self.create_container(&spec, &network).await?;
            self.specs.push(spec);
        }
        Ok(())
    }

    /// The gateway of the run's network: the host's address as its
    /// containers see it.
    pub async fn network_gateway(&self) -> anyhow::Result<Ipv4Addr> {
        let network = self.network.as_deref().context("adopted containers have no network of the run")?;
        self.gateway_of(network).await
    }

    /// Takes over containers that are already running, `(node, container name
    /// or id)`, such as a test's testcontainers. Faults reach them as they
    /// reach the backend's own; when the backend drops they are resumed and
    /// their links healed, never removed: they belong to whoever started them.
    pub async fn adopt(run_id: &str, nodes: Vec<(Node, String)>, tools_image: &str) -> anyhow::Result<DockerBackend> {
        let docker = connect().await?;
        for (node, container) in &nodes {
            docker
                .inspect_container(container, None)
                .await
                .map_err(|e| anyhow::anyhow!("{}", said(&e)))
                .with_context(|| format!("node {}: no container {container}", node.name))?;
        }
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).push(run_id.to_owned());
        Ok(DockerBackend {
            docker,
            run_id: run_id.to_owned(),
            network: None,
            mount_exe: None,
            specs: Vec::new(),
            members: nodes.into_iter().map(|(node, container)| Member { node, container }).collect(),
            tools_image: tools_image.to_owned(),
            removed: AtomicBool::new(false),
            paused_ids: Default::default(),
        })
    }

    /// The run's label, and the node's when there is one.
    fn labels(&self, node: Option<&Node>) -> HashMap<String, String> {
        let mut labels = HashMap::from([(RUN_LABEL.to_owned(), self.run_id.clone())]);
        if let Some(node) = node {
            labels.insert("io.haunt.node".to_owned(), node.name.clone());
        }
        labels
    }

    async fn create_container(&self, spec: &ContainerSpec, network: &str) -> anyhow::Result<()> {
        let name = self.container(&spec.node);
        let port_bindings = spec
            .ports
            .iter()
            .map(|(host, inner)| {
                let binding = PortBinding { host_ip: Some("127.0.0.1".into()), host_port: Some(host.to_string()) };
                (format!("{inner}/tcp"), Some(vec![binding]))
            })
            .collect();
        let mut binds: Vec<String> =
            self.mount_exe.iter().map(|exe| format!("{}:/usr/local/bin/haunt:ro", exe.display())).collect();
        binds.extend(spec.mounts.iter().map(|dir| format!("{0}:{0}", dir.display())));
        let endpoint = EndpointSettings { aliases: Some(vec![spec.node.name.clone()]), ..Default::default() };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(spec.args.clone()),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            hostname: Some(spec.node.name.clone()),
            working_dir: spec.workdir.as_ref().map(|d| d.display().to_string()),
            labels: Some(self.labels(Some(&spec.node))),
            exposed_ports: Some(spec.ports.iter().map(|(_, inner)| format!("{inner}/tcp")).collect()),
            healthcheck: (!spec.health_check)
                .then(|| HealthConfig { test: Some(vec!["NONE".into()]), ..Default::default() }),
            host_config: Some(HostConfig {
                network_mode: Some(network.to_owned()),
                port_bindings: Some(port_bindings),
                binds: Some(binds),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(network.to_owned(), endpoint)])),
            }),
            ..Default::default()
        };
        let options = CreateContainerOptions { name: Some(name.clone()), ..Default::default() };
        self.docker
            .create_container(Some(options), body)
            .await
            .map_err(|e| anyhow::anyhow!("creating container {name}: {}", said(&e)))?;
        Ok(())
    }

    /// The node's container: its name, or the id it was adopted by.
    pub fn container(&self, node: &Node) -> String {
        match self.members.iter().find(|m| m.node.name == node.name) {
            Some(member) => member.container.clone(),
            None => format!("haunt-{}-{}", self.run_id, node.name),
        }
    }

    async fn inspect(&self, node: &Node) -> anyhow::Result<bollard::models::ContainerInspectResponse> {
        self.docker
            .inspect_container(&self.container(node), None)
            .await
            .map_err(|e| anyhow::anyhow!("inspecting {}: {}", node.name, said(&e)))
    }

    /// The node's networks and its address on each (they may change after a restart).
    async fn addresses(&self, node: &Node) -> anyhow::Result<Vec<(String, Ipv4Addr)>> {
        let networks = self.inspect(node).await?.network_settings.and_then(|s| s.networks).unwrap_or_default();
        let mut found: Vec<(String, Ipv4Addr)> =
            networks.into_iter().filter_map(|(name, e)| Some((name, e.ip_address?.parse().ok()?))).collect();
        // The run's own network first, then by name: the same answer every time.
        found.sort_by_key(|(name, _)| (Some(name) != self.network.as_ref(), name.clone()));
        anyhow::ensure!(!found.is_empty(), "{} has no IPv4 address (is it running?)", node.name);
        Ok(found)
    }

    /// `peer`'s address on a network it shares with `node`.
    pub async fn ip_toward(&self, node: &Node, peer: &Node) -> anyhow::Result<Ipv4Addr> {
        let mine = self.addresses(node).await?;
        let theirs = self.addresses(peer).await?;
        theirs
            .iter()
            .find(|(net, _)| mine.iter().any(|(n, _)| n == net))
            .map(|(_, ip)| *ip)
            .with_context(|| format!("{} and {} share no network", node.name, peer.name))
    }

    /// The gateway of the node's first network: where traffic from the host
    /// (published ports) comes from.
    pub async fn gateway(&self, node: &Node) -> anyhow::Result<Ipv4Addr> {
        let (network, _) = self.addresses(node).await?.remove(0);
        self.gateway_of(&network).await
    }

    async fn gateway_of(&self, network: &str) -> anyhow::Result<Ipv4Addr> {
        let inspect = self
            .docker
            .inspect_network(network, None)
            .await
            .map_err(|e| anyhow::anyhow!("inspecting network {network}: {}", said(&e)))?;
        let configs = inspect.ipam.and_then(|i| i.config).unwrap_or_default();
        configs
            .into_iter()
            .find_map(|c| c.gateway.and_then(|g| g.parse().ok()))
            .with_context(|| format!("network {network} has no IPv4 gateway"))
    }

    /// What [`DockerBackend::resume`] does for an engine that does not
    /// answer the unpause of `node` ([`unstick`]), asked for directly: the
    /// node's container, which this backend paused, thawed and frozen again
    /// behind the engine's back, then unpaused by the engine. Returns the
    /// cgroup file written.
    pub async fn unstick(&self, node: &Node) -> anyhow::Result<PathBuf> {
        let name = self.container(node);
        let id = self.paused_ids.lock().unwrap_or_else(|p| p.into_inner()).get(&name).cloned();
        unstick(&self.docker, &name, &id.with_context(|| format!("{} was not paused by this backend", node.name))?)
            .await
    }

    /// `running/healthy`, `paused/`, `exited/`, …: the state and the health
    /// check's status, if the image has one.
    pub async fn state(&self, node: &Node) -> anyhow::Result<String> {
        let state = self.inspect(node).await?.state.unwrap_or_default();
        let status = state.status.map(|s| s.to_string()).unwrap_or_default();
        let health = match state.health.and_then(|h| h.status) {
            Some(HealthStatusEnum::EMPTY | HealthStatusEnum::NONE) | None => String::new(),
            Some(h) => h.to_string(),
        };
        Ok(format!("{status}/{health}"))
    }

    /// Waits until the image's health check passes (or, without one, until the
    /// container runs).
    pub async fn wait_healthy(&self, node: &Node, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let state = self.state(node).await?;
            match state.split_once('/') {
                Some(("running", "healthy" | "")) => return Ok(()),
                Some(("exited" | "dead", _)) => anyhow::bail!("{} exited while starting; see its log", node.name),
                _ => {}
            }
            anyhow::ensure!(Instant::now() < deadline, "{} not healthy within {limit:?} ({state})", node.name);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Runs a shell script as root in a helper container of the tools image
    /// that shares the node's network namespace, with `NET_ADMIN`; returns its
    /// output. The node may be paused; one that is not running fails with the
    /// engine's "non running container".
    pub async fn in_netns(&self, node: &Node, script: &str) -> anyhow::Result<String> {
        let helper = Helper { tools_image: &self.tools_image, labels: self.labels(None), target: self.container(node) };
        helper.run(&self.docker, script).await.with_context(|| format!("in {}'s network namespace", node.name))
    }

    /// Whether `node` can open a TCP connection to `host:port` within 2 s.
    pub async fn probe(&self, node: &Node, host: &str, port: u16) -> bool {
        let script = format!("timeout 2 bash -c '</dev/tcp/{host}/{port}'");
        self.in_netns(node, &script).await.is_ok()
    }

    /// Copies every node's output to `dir/<node>.log`.
    pub fn save_logs(&self, dir: &Path) {
        let _ = blocking(|docker| async move {
            for member in &self.members {
                let text = logs(&docker, &member.container).await;
                let _ = std::fs::write(dir.join(format!("{}.log", member.node.name)), text);
            }
            Ok(())
        });
    }

    /// Removes every container and the network this run created; adopted
    /// containers are resumed instead. Idempotent.
    pub fn remove(&self) {
        if self.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).retain(|r| *r != self.run_id);
        if self.specs.is_empty() {
            for member in &self.members {
                let _ = self.resume_blocking(&member.node);
            }
        }
        if let Err(e) = remove_labelled(&format!("{RUN_LABEL}={}", self.run_id)) {
            eprintln!("haunt: removing the containers of run {}: {e:#} (try `haunt clean`)", self.run_id);
        }
    }

    /// Whether the backend took its containers over rather than creating them.
    fn adopted(&self) -> bool {
        self.network.is_none()
    }
}

impl Drop for DockerBackend {
    fn drop(&mut self) {
        self.remove();
    }
}

impl Backend for DockerBackend {
    fn nodes(&self) -> Vec<Node> {
        self.members.iter().map(|m| m.node.clone()).collect()
    }

    fn start<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            match self.docker.start_container(&self.container(node), None).await {
                // 304: already running, which is what was asked for.
                Ok(()) | Err(ApiError::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
                Err(e) => anyhow::bail!("starting {}: {}", node.name, said(&e)),
            }
        })
    }

    fn stop<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let name = self.container(node);
            if self.state(node).await?.starts_with("paused") {
                self.resume(node).await?;
            }
            // SIGTERM, then SIGKILL after 5 s, as the local backend does.
            let options = StopContainerOptions { t: Some(5), ..Default::default() };
            match self.docker.stop_container(&name, Some(options)).await {
                Ok(()) | Err(ApiError::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
                Err(e) => anyhow::bail!("stopping {}: {}", node.name, said(&e)),
            }
        })
    }

    fn kill<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let options = KillContainerOptions { signal: "KILL".into() };
            match self.docker.kill_container(&self.container(node), Some(options)).await {
                Ok(()) => Ok(()),
                // Already dead is what was asked for.
                Err(e) if said(&e).contains("is not running") => Ok(()),
                Err(e) => anyhow::bail!("killing {}: {}", node.name, said(&e)),
            }
        })
    }

    fn pause<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let name = self.container(node);
            // Its id, while the engine still answers for it: see `resume`.
            if let Some(id) = self.inspect(node).await.ok().and_then(|i| i.id) {
                self.paused_ids.lock().unwrap_or_else(|p| p.into_inner()).insert(name.clone(), id);
            }
            self.docker.pause_container(&name).await.map_err(|e| anyhow::anyhow!("pausing {}: {}", node.name, said(&e)))
        })
    }

    /// An unpause the engine does not answer within [`UNPAUSE_WAIT`] is
    /// helped through the container's cgroup ([`unstick`]).
    fn resume<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let name = self.container(node);
            let id = self.paused_ids.lock().unwrap_or_else(|p| p.into_inner()).get(&name).cloned();
            unpause(&self.docker, &name, id.as_deref(), false).await.with_context(|| format!("resuming {}", node.name))
        })
    }

    fn resume_blocking(&self, node: &Node) -> anyhow::Result<()> {
        let name = self.container(node);
        let id = self.paused_ids.lock().unwrap_or_else(|p| p.into_inner()).get(&name).cloned();
        blocking(|docker| async move { unpause(&docker, &name, id.as_deref(), true).await })
    }

    fn teardown(&self, logs: &Path) {
        self.save_logs(logs);
        self.remove();
    }

    fn is_running(&self, node: &Node) -> bool {
        let name = self.container(node);
        let ask = || {
            blocking(|docker| async move {
                let state = docker.inspect_container(&name, None).await.map_err(|e| anyhow::anyhow!("{}", said(&e)))?;
                // A paused container is running: it resumes where it stopped.
                Ok(state.state.and_then(|s| s.running) == Some(true))
            })
        };
        // The trait is synchronous; on the harness's multi-threaded runtime the
        // wait moves off the worker thread, as the local backend's reap does.
        let answer = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(ask),
            _ => ask(),
        };
        answer.unwrap_or(false)
    }
}
/// The database node of a Docker run.
pub fn postgres_node() -> Node {
    Node { name: "postgres".into(), role: Role::Database }
}
