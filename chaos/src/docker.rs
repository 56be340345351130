//! The Docker backend: PostgreSQL, the API and the workers as containers on a
//! private network; node faults by `docker kill`/`start`/`pause`, link faults by
//! iptables inside a container's network namespace.
//!
//! Everything it creates is named `haunt-<run id>-…` and labelled
//! [`RUN_LABEL`]`=<run id>`. Dropping the backend removes its containers and its
//! network, which covers errors, Ctrl-C and panics; [`clean`] (`haunt clean`)
//! removes what a harness killed outright left behind. Ports are published on
//! 127.0.0.1 only. It drives the `docker` command line, which speaks to every
//! engine version the way a user would.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use crate::roles::{Backend, BoxFuture, Nemesis, Node, Role};

/// The label on every container and network of a run; its value is the run id.
pub const RUN_LABEL: &str = "io.haunt.run";

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

/// Runs `docker ARGS`, returning its standard output; a failure carries stderr.
async fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new("docker")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("running docker (is the Docker CLI installed? scripts/docker sets it up)")?;
    finish(args, out)
}

/// [`docker`] for places without a runtime: `Drop`, `haunt clean`.
fn docker_blocking(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("docker")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("running docker (is the Docker CLI installed? scripts/docker sets it up)")?;
    finish(args, out)
}

fn finish(args: &[&str], out: std::process::Output) -> anyhow::Result<String> {
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    anyhow::bail!("docker {}: {}", args.first().unwrap_or(&""), err.trim())
}

/// Fails with directions when no engine answers.
pub async fn ensure_engine() -> anyhow::Result<()> {
    docker(&["version", "--format", "{{.Server.Version}}"])
        .await
        .context("no Docker engine answers: start one (scripts/docker installs and starts it on Debian as root)")?;
    Ok(())
}

/// Fails with directions when an image is missing.
pub async fn ensure_image(image: &str) -> anyhow::Result<()> {
    docker(&["image", "inspect", "--format", "{{.Id}}", image])
        .await
        .with_context(|| format!("image {image} is missing: build it with scripts/images"))?;
    Ok(())
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
    /// Lets the harness add iptables rules in the container's namespace (exec as
    /// root); the service itself runs as an unprivileged user without it.
    pub net_admin: bool,
}

#[derive(Debug)]
pub struct DockerBackend {
    run_id: String,
    network: String,
    /// Mounted over the image's `haunt`, so the containers run the harness's own code.
    mount_exe: Option<PathBuf>,
    specs: Vec<ContainerSpec>,
    removed: AtomicBool,
}

impl DockerBackend {
    /// Creates the network and every container (not started). On an error,
    /// whatever was created is removed again.
    pub async fn create(
        run_id: &str,
        mount_exe: Option<PathBuf>,
        specs: Vec<ContainerSpec>,
    ) -> anyhow::Result<DockerBackend> {
        let backend = DockerBackend {
            run_id: run_id.to_owned(),
            network: format!("haunt-{run_id}"),
            mount_exe,
            specs,
            removed: AtomicBool::new(false),
        };
        let label = format!("{RUN_LABEL}={run_id}");
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).push(run_id.to_owned());
        docker(&["network", "create", "--label", &label, &backend.network]).await?;
        for spec in &backend.specs {
            backend.create_container(spec, &label).await?;
        }
        Ok(backend)
    }

    async fn create_container(&self, spec: &ContainerSpec, label: &str) -> anyhow::Result<()> {
        let name = self.container(&spec.node);
        let mut args: Vec<String> =
            ["create", "--name", &name, "--hostname", &spec.node.name].into_iter().map(String::from).collect();
        args.extend(["--network".into(), self.network.clone(), "--label".into(), label.to_owned()]);
        args.extend(["--label".into(), format!("io.haunt.node={}", spec.node.name)]);
        if spec.net_admin {
            args.extend(["--cap-add".into(), "NET_ADMIN".into()]);
        }
        for (host, inner) in &spec.ports {
            args.extend(["--publish".into(), format!("127.0.0.1:{host}:{inner}")]);
        }
        for (k, v) in &spec.env {
            args.extend(["--env".into(), format!("{k}={v}")]);
        }
        if let Some(exe) = &self.mount_exe {
            args.extend(["--volume".into(), format!("{}:/usr/local/bin/haunt:ro", exe.display())]);
        }
        args.push(spec.image.clone());
        args.extend(spec.args.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&refs).await.with_context(|| format!("creating container {name}"))?;
        Ok(())
    }

    /// The container's name, also its host name on the run's network.
    pub fn container(&self, node: &Node) -> String {
        format!("haunt-{}-{}", self.run_id, node.name)
    }

    /// The node's address on the run's network (it may change after a restart).
    pub async fn ip(&self, node: &Node) -> anyhow::Result<Ipv4Addr> {
        let format = format!("{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}", self.network);
        let ip = docker(&["inspect", "--format", &format, &self.container(node)]).await?;
        ip.parse().with_context(|| format!("{} has no address on {} (is it running?)", node.name, self.network))
    }

    /// The network's gateway: where traffic from the host (published ports) comes from.
    pub async fn gateway(&self) -> anyhow::Result<Ipv4Addr> {
        let gw =
            docker(&["network", "inspect", "--format", "{{(index .IPAM.Config 0).Gateway}}", &self.network]).await?;
        gw.parse().with_context(|| format!("network {} has no IPv4 gateway", self.network))
    }

    async fn state(&self, node: &Node) -> anyhow::Result<String> {
        docker(&[
            "inspect",
            "--format",
            "{{.State.Status}}/{{if .State.Health}}{{.State.Health.Status}}{{end}}",
            &self.container(node),
        ])
        .await
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

    /// Runs a shell script as root inside the node's container.
    pub async fn exec_root(&self, node: &Node, script: &str) -> anyhow::Result<String> {
        docker(&["exec", "--user", "root", &self.container(node), "sh", "-c", script]).await
    }

    /// Whether `node` can open a TCP connection to `host:port` within 2 s.
    pub async fn probe(&self, node: &Node, host: &str, port: u16) -> bool {
        let script = format!("timeout 2 bash -c '</dev/tcp/{host}/{port}'");
        docker(&["exec", &self.container(node), "sh", "-c", &script]).await.is_ok()
    }

    /// Copies every container's output to `dir/<node>.log`.
    pub fn save_logs(&self, dir: &Path) {
        for spec in &self.specs {
            let out = std::process::Command::new("docker").args(["logs", &self.container(&spec.node)]).output();
            if let Ok(out) = out {
                let mut text = out.stdout;
                text.extend_from_slice(&out.stderr);
                let _ = std::fs::write(dir.join(format!("{}.log", spec.node.name)), text);
            }
        }
    }

    /// Removes every container and the network of this run. Idempotent.
    pub fn remove(&self) {
        if self.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).retain(|r| *r != self.run_id);
        if let Err(e) = remove_labelled(&format!("{RUN_LABEL}={}", self.run_id)) {
            eprintln!("haunt: removing the containers of run {}: {e:#} (try `haunt clean`)", self.run_id);
        }
    }
}

impl Drop for DockerBackend {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Removes the containers (with their anonymous volumes) and networks that
/// carry `label` (`key` or `key=value`). Returns how many of each.
fn remove_labelled(label: &str) -> anyhow::Result<(usize, usize)> {
    let filter = format!("label={label}");
    let containers = docker_blocking(&["ps", "--all", "--quiet", "--filter", &filter])?;
    let containers: Vec<&str> = containers.lines().filter(|l| !l.is_empty()).collect();
    if !containers.is_empty() {
        let mut args = vec!["rm", "--force", "--volumes"];
        args.extend(&containers);
        docker_blocking(&args)?;
    }
    let networks = docker_blocking(&["network", "ls", "--quiet", "--filter", &filter])?;
    let networks: Vec<&str> = networks.lines().filter(|l| !l.is_empty()).collect();
    if !networks.is_empty() {
        let mut args = vec!["network", "rm"];
        args.extend(&networks);
        docker_blocking(&args)?;
    }
    Ok((containers.len(), networks.len()))
}

/// `haunt clean`: removes every container and network any haunt run created.
pub fn clean() -> anyhow::Result<(usize, usize)> {
    remove_labelled(RUN_LABEL)
}

/// What `docker ps` shows of haunt's containers and networks (for tests and `haunt clean --dry-run`).
pub fn leftovers() -> anyhow::Result<Vec<String>> {
    let filter = format!("label={RUN_LABEL}");
    let mut names: Vec<String> = docker_blocking(&["ps", "--all", "--format", "{{.Names}}", "--filter", &filter])?
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    names.extend(
        docker_blocking(&["network", "ls", "--format", "{{.Name}}", "--filter", &filter])?
            .lines()
            .filter(|l| !l.is_empty())
            .map(|n| format!("network {n}")),
    );
    Ok(names)
}

impl Backend for DockerBackend {
    fn nodes(&self) -> Vec<Node> {
        self.specs.iter().map(|s| s.node.clone()).collect()
    }

    fn start<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            // `docker start` on a running container is a no-op.
            docker(&["start", &self.container(node)]).await.map(drop)
        })
    }

    fn stop<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let name = self.container(node);
            if self.state(node).await?.starts_with("paused") {
                docker(&["unpause", &name]).await?;
            }
            // SIGTERM, then SIGKILL after 5 s, as the local backend does.
            docker(&["stop", "--time", "5", &name]).await.map(drop)
        })
    }

    fn kill<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let name = self.container(node);
            match docker(&["kill", "--signal", "KILL", &name]).await {
                Ok(_) => Ok(()),
                // Already dead is what was asked for.
                Err(e) if format!("{e}").contains("is not running") => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    fn pause<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { docker(&["pause", &self.container(node)]).await.map(drop) })
    }

    fn resume<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { docker(&["unpause", &self.container(node)]).await.map(drop) })
    }

    fn resume_blocking(&self, node: &Node) -> anyhow::Result<()> {
        docker_blocking(&["unpause", &self.container(node)]).map(drop)
    }

    fn teardown(&self, logs: &Path) {
        self.save_logs(logs);
        self.remove();
    }

    fn is_running(&self, node: &Node) -> bool {
        let name = self.container(node);
        let ask = || docker_blocking(&["inspect", "--format", "{{.State.Running}}", &name]);
        // The trait is synchronous; on the harness's multi-threaded runtime the
        // wait for the CLI moves off the worker thread, as the local backend's reap does.
        let out = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(ask),
            _ => ask(),
        };
        matches!(out.as_deref(), Ok("true"))
    }
}

/// The far end of a link, seen from the container whose rules cut it.
#[derive(Debug, Clone)]
pub enum Peer {
    /// Another container of the run (the database).
    Node(Node),
    /// The host, through a published port: the harness's clients.
    Host { port: u16 },
}

/// A link cut by iptables rules in one container's network namespace. The
/// rules live in two chains of their own (`haunt-partition`, `haunt-loss`), so
/// healing one fault flushes only its chain. A container that is restarted gets
/// a fresh namespace, and with it a healed link.
#[derive(Debug)]
pub struct IptablesLink {
    backend: Arc<DockerBackend>,
    node: Node,
    peer: Peer,
}

/// Creates both chains on first use and hooks them into INPUT and OUTPUT.
const CHAINS: &str = "for c in haunt-partition haunt-loss; do \
    if iptables -N $c 2>/dev/null; then iptables -I INPUT -j $c && iptables -I OUTPUT -j $c || exit 1; fi; done";

impl IptablesLink {
    pub fn new(backend: Arc<DockerBackend>, node: Node, peer: Peer) -> IptablesLink {
        IptablesLink { backend, node, peer }
    }

    /// The match for packets from the peer, then for packets to it.
    async fn matches(&self) -> anyhow::Result<(String, String)> {
        Ok(match &self.peer {
            Peer::Node(peer) => {
                let ip = self.backend.ip(peer).await?;
                (format!("-s {ip}"), format!("-d {ip}"))
            }
            Peer::Host { port } => {
                let gw = self.backend.gateway().await?;
                (format!("-s {gw} -p tcp --dport {port}"), format!("-d {gw} -p tcp --sport {port}"))
            }
        })
    }

    async fn add(&self, chain: &str, extra: &str) -> anyhow::Result<()> {
        let (from, to) = self.matches().await?;
        let script =
            format!("{CHAINS}; iptables -A {chain} {from} {extra} -j DROP && iptables -A {chain} {to} {extra} -j DROP");
        self.backend.exec_root(&self.node, &script).await.map(drop)
    }

    /// Drops every packet both ways.
    pub async fn cut(&self) -> anyhow::Result<()> {
        self.add("haunt-partition", "").await
    }

    /// Drops each packet, both ways, with this probability.
    pub async fn lose(&self, probability: f64) -> anyhow::Result<()> {
        self.add("haunt-loss", &format!("-m statistic --mode random --probability {probability:.3}")).await
    }

    /// Flushes one chain. A container that is not running has nothing to heal
    /// (it gets a fresh namespace when it starts); a paused one is waited for.
    async fn flush(&self, chain: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.backend.exec_root(&self.node, &format!("iptables -F {chain} 2>/dev/null; true")).await {
                Ok(_) => return Ok(()),
                Err(e) if format!("{e}").contains("is not running") => return Ok(()),
                Err(e) if format!("{e}").contains("paused") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    pub async fn heal(&self) -> anyhow::Result<()> {
        self.flush("haunt-partition").await
    }

    pub async fn heal_loss(&self) -> anyhow::Result<()> {
        self.flush("haunt-loss").await
    }
}

impl crate::nemesis::Link for IptablesLink {
    fn cut(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(IptablesLink::cut(self))
    }
    fn heal(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(IptablesLink::heal(self))
    }
    /// Nothing: the rules live in the container's network namespace, which
    /// goes with the container when the backend drops.
    fn heal_blocking(&self) {}
}

/// Random packet loss on a link (iptables `statistic` match): TCP retransmits,
/// so requests slow down and some time out, without a clean cut.
#[derive(Debug)]
pub struct LossNemesis {
    links: Vec<(String, Arc<IptablesLink>)>,
    probability: f64,
}

impl LossNemesis {
    pub fn new(links: Vec<(String, Arc<IptablesLink>)>, probability: f64) -> Self {
        LossNemesis { links, probability }
    }
}

impl Nemesis for LossNemesis {
    fn name(&self) -> &'static str {
        "loss"
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("start-loss", "stop-loss")
    }
    fn targets(&self) -> Vec<String> {
        self.links.iter().map(|(n, _)| n.clone()).collect()
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let (_, link) = self.links.iter().find(|(n, _)| n == target).context("unknown link")?;
            link.lose(self.probability).await
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            for (_, link) in &self.links {
                link.heal_loss().await?;
            }
            Ok(())
        })
    }
}

/// The database node of a Docker run.
pub fn postgres_node() -> Node {
    Node { name: "postgres".into(), role: Role::Database }
}
