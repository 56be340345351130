//! The reference pipeline as a [`System`]: the API and the workers over
//! SQLite or PostgreSQL, as child processes (the local backend) or as
//! containers on a private network with a PostgreSQL container of their own
//! (the Docker backend). With a broker transport, the broker runs as a
//! node of its own (a process, or a container) and a relay publishes the
//! outbox to it.
//! Everything about how it is laid out lives here: the ports, the fault
//! proxies in front of the API, the database and the broker, the services'
//! arguments, the admin token of their fault switches.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use haunt_store::{DbUrl, Rng, Store, StoreOptions};

use haunt_format::{FinalLine, Pending};
use haunt_transport::{Depth, TransportSpec};

use crate::backends::local::{LocalBackend, NodeSpec, api_node, relay_node, worker_node};
use crate::backends::postgres::PgServer;
use crate::backends::proxy::FaultProxy;
use crate::core::admin::Admin;
use crate::core::link::{SharedLink, SharedSlow};
use crate::core::options::{BackendKind, RunOptions};
use crate::core::progress::say;
use crate::core::roles::{Backend, BoxFuture, Client, Joined, Node};
use crate::core::system::{FinalSink, Surfaces, Switches, System};
use crate::core::workload::HttpClient;
use crate::systems::brokers::{Broker, BrokerNode};

mod broker;
mod docker;
use broker::local_broker;
use docker::docker_pipeline;

/// The reference pipeline of one run, its nodes created (a Docker run's
/// database started) but not started.
#[derive(Debug)]
pub struct Pipeline {
    surfaces: Surfaces,
    /// The harness's own connection, for the queue's depth and the final state.
    store: Store,
    /// The database as the harness reaches it.
    db: String,
    client: Arc<HttpClient>,
    /// Each service and the base URL of its metrics (the API's is its own).
    endpoints: Vec<(Node, String)>,
    /// The broker of a broker transport, as the harness reaches it.
    broker: Option<BrokerSide>,
}

/// The broker of a run, seen from the harness (directly, not through the
/// fault proxies its clients go through).
#[derive(Debug)]
struct BrokerSide {
    transport: TransportSpec,
    /// Its nodes: one, or a Kafka cluster's.
    laid: Vec<BrokerNode>,
    url: String,
    /// How long nothing may wait in a broker that cannot count what its
    /// consumers hold before the run calls it drained: twice the visibility
    /// timeout, which is also the broker's ack timeout where it has one to
    /// set (RabbitMQ's `consumer_timeout`).
    settle: Duration,
}

impl BrokerSide {
    /// The broker `laid` out for a run of `options`, reached directly.
    fn new(options: &RunOptions, laid: Vec<BrokerNode>) -> BrokerSide {
        let transport = options.transport;
        let addrs: Vec<String> = laid.iter().map(|l| l.addr.to_string()).collect();
        let url = haunt_transport::url(transport, &addrs.join(","));
        BrokerSide { transport, laid, url, settle: options.visibility_timeout * 2 }
    }

    /// The first node (the only one but in a Kafka cluster).
    fn first(&self) -> &BrokerNode {
        &self.laid[0]
    }

    async fn depth(&self) -> anyhow::Result<Depth> {
        let inspector = haunt_transport::inspector(self.transport, &self.url).await?;
        Ok(inspector.depth().await?)
    }

    /// Drained while the consumers run (`haunt_transport::Inspector::drained`).
    async fn drained(&self) -> anyhow::Result<bool> {
        let inspector = haunt_transport::inspector(self.transport, &self.url).await?;
        Ok(inspector.drained(self.settle).await?)
    }
}

/// What is checked before the run directory exists, so that a refused run
/// leaves nothing behind: the database given by URL is empty, the Docker
/// engine answers and has the images.
#[derive(Debug)]
pub struct Prepared {
    given: Option<(DbUrl, Store)>,
}

impl Pipeline {
    pub async fn prepare(options: &RunOptions) -> anyhow::Result<Prepared> {
        if options.backend == BackendKind::Docker {
            crate::backends::docker::ensure_engine().await?;
            crate::backends::docker::ensure_image(&options.docker.image).await?;
            crate::backends::docker::ensure_image(&options.docker.postgres_image).await?;
            if options.transport.is_broker() {
                crate::backends::docker::ensure_image(&options.docker.brokers_image).await?;
            }
        }
        let given = match &options.db {
            Some(url) => Some((url.clone(), open_empty(url).await?)),
            None => None,
        };
        Ok(Prepared { given })
    }

    /// Lays the pipeline out: its ports, proxies and nodes, the run's store
    /// open on its database (a fresh SQLite file in `run_dir` by default).
    pub async fn create(options: &RunOptions, prepared: Prepared, run_dir: &Path) -> anyhow::Result<Pipeline> {
        let mut rng = Rng::from_entropy();
        let token = format!("{:016x}{:016x}", rng.next_u64(), rng.next_u64());
        if options.backend == BackendKind::Docker {
            let run_id = format!("{:08x}", rng.next_u64() as u32);
            say(options.quiet, &format!("starting containers haunt-{run_id}-* (PostgreSQL first)"));
            return docker_pipeline(options, &run_id, &token, run_dir).await;
        }
        let (db, store) = match prepared.given {
            Some(given) => given,
            None => {
                let url = DbUrl::sqlite_file(&run_dir.join("haunt.db"));
                let store = open_empty(&url).await?;
                (url, store)
            }
        };
        local_pipeline(options, db, store, run_dir, &token).await
    }
}

impl System for Pipeline {
    fn surfaces(&self) -> &Surfaces {
        &self.surfaces
    }

    fn client(&self) -> Arc<dyn Client> {
        self.client.clone()
    }

    fn ready(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            if let Some(broker) = &self.broker {
                let backend = &self.surfaces.backend;
                for laid in &broker.laid {
                    let node = &laid.spec.node;
                    laid.ready.wait(laid.broker.start_limit(), || backend.is_running(node)).await.map_err(|last| {
                        anyhow::anyhow!(
                            "the {} broker {} did not answer within {:?} (last: {last}; its log is logs/{}.log)",
                            laid.broker.name(),
                            node.name,
                            laid.broker.start_limit(),
                            node.name,
                        )
                    })?;
                }
                // Declared by the harness before the run: RabbitMQ 3.10.8 lost
                // a quorum queue for good when the node crashed within about a
                // second of its declaration (publishes nacked, consumers
                // refused with INTERNAL_ERROR), and a broker-restart early in
                // the run hit that, not what the run meant to test. So the
                // queue is declared here, and given two seconds to settle.
                let inspector = haunt_transport::inspector(broker.transport, &broker.url).await?;
                inspector.declare().await.context("declaring the broker's queue")?;
                if broker.first().broker == Broker::RabbitMq {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
            // A cold start compiles nothing but opens the database and
            // migrates; 30 s covers a slow disk. Every service says it is
            // ready: the API once its database answers, a relay or a worker
            // once all its broker clients are connected. Without waiting for
            // those, a relay still backing off from a booting broker left the
            // first seconds of a run with nothing in flight, and the faults
            // of those seconds hit nothing.
            for (_, url) in &self.endpoints {
                let url = format!("{url}/readyz");
                let limit = Duration::from_secs(30);
                crate::core::system::wait_ready(&url, limit, || true).await.map_err(|last| {
                    anyhow::anyhow!(
                        "{url} did not answer within {limit:?} (last: {last}; the service's log is in the run's logs/)"
                    )
                })?;
            }
            Ok(())
        })
    }

    /// A Kafka cluster's partition leaders, as each fault strikes.
    fn fault_context(&self) -> Option<Arc<dyn crate::core::system::FaultContext>> {
        let broker = self.broker.as_ref().filter(|b| b.laid.len() > 1)?;
        Some(Arc::new(broker::Leaders { transport: broker.transport, url: broker.url.clone() }))
    }

    /// Quiet: the queue (with a broker, the outbox) is empty, and so is
    /// the broker: nothing ready, nothing delivered and not acked.
    fn is_quiet(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(async move {
            let s = self.store.queue_stats().await?;
            if s.visible + s.leased + s.delayed > 0 {
                return Ok(false);
            }
            match &self.broker {
                Some(broker) => broker.drained().await,
                None => Ok(true),
            }
        })
    }

    /// The database's final state, and what the broker still holds as
    /// `pending` lines, where it can list them.
    fn read_final_state<'a>(&'a self, sink: &'a mut FinalSink<'_>) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            self.store.final_state(&mut *sink).await.context("reading the final state")?;
            let Some(broker) = &self.broker else { return Ok(()) };
            if let Depth::Listed(held) = broker.depth().await.context("reading what the broker still holds")? {
                for h in held {
                    let delivery_count = u32::try_from(h.delivery_count).unwrap_or(0);
                    sink(FinalLine::Pending(Pending {
                        message_id: h.message_id,
                        event_id: h.event_id,
                        delivery_count,
                    }))?;
                }
            }
            Ok(())
        })
    }

    /// What a broker that can only count still holds.
    fn unlisted(&self) -> BoxFuture<'_, anyhow::Result<u64>> {
        Box::pin(async move {
            match &self.broker {
                Some(broker) => match broker.depth().await.context("counting what the broker still holds")? {
                    Depth::Counted(n) => Ok(n),
                    Depth::Listed(_) => Ok(0),
                },
                None => Ok(0),
            }
        })
    }

    fn metrics(&self) -> Vec<(Node, String)> {
        self.endpoints.clone()
    }

    fn database(&self) -> String {
        self.db.clone()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.store.close())
    }
}

/// The fault switches of the API and the workers, behind `token`: the
/// workers take every switch fault and hold at their one point, and the API
/// takes database errors too.
fn switches(token: &str, endpoints: &[(Node, String)]) -> anyhow::Result<Switches> {
    use crate::core::admin::AdminNode;
    use crate::core::fault::Fault;
    use crate::core::roles::Role;
    // The relay has no fault switches of its own.
    let nodes = endpoints.iter().filter(|(n, _)| n.role != Role::Relay).map(|(n, url)| AdminNode::new(&n.name, url));
    let services = Admin::new(token.to_owned(), nodes.collect())?;
    let workers = services.only(|a| endpoints.iter().any(|(n, _)| n.name == a.name && n.role == Role::Worker));
    Ok(Switches {
        by_fault: vec![
            (Fault::AckLoss, workers.clone()),
            (Fault::ClockSkew, workers.clone()),
            (Fault::Stall, workers.clone()),
            (Fault::DbError, services),
        ],
        holds: workers,
    })
}

/// A free port and the listener that holds it. Held until the ports of a
/// cluster are all chosen and its fault proxies listen, so that none of them
/// is handed the same port (a proxy that got the API's port forwarded to
/// itself, and the API could not bind: a run that never became ready).
/// Below the ephemeral range ([`publishable_port`]): a service binds it
/// after each restart, and meanwhile no outgoing connection can take it.
fn reserve_port() -> anyhow::Result<(SocketAddr, std::net::TcpListener)> {
    let (port, l) = crate::systems::brokers::publishable_port()?;
    Ok((SocketAddr::from(([127, 0, 0, 1], port)), l))
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
async fn db_proxies(db: &DbUrl, names: &[String]) -> anyhow::Result<Vec<(String, Arc<FaultProxy>, String)>> {
    if !db.is_postgres() {
        return Ok(Vec::new());
    }
    let Some((before, host_port, after)) = split_postgres_url(db.as_str()) else {
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

/// The local layout: the services as child processes, a fault proxy between
/// the clients and the API and one between each service and PostgreSQL, and
/// the PostgreSQL server as a node of its own when its data directory is known.
async fn local_pipeline(
    options: &RunOptions,
    db: DbUrl,
    store: Store,
    run_dir: &Path,
    token: &str,
) -> anyhow::Result<Pipeline> {
    let transport = options.transport;
    let mut names = vec![api_node().name];
    if transport.is_broker() {
        names.push(relay_node().name);
    }
    names.extend((1..=options.workers).map(|i| worker_node(i).name));
    let proxies = db_proxies(&db, &names).await?;
    let db_for = |name: &str| -> String {
        let link = format!("{name}<->db");
        proxies.iter().find(|(l, _, _)| *l == link).map_or_else(|| db.to_string(), |(_, _, url)| url.clone())
    };
    let mut reserved = Vec::new();
    let (api_addr, held) = reserve_port()?;
    reserved.push(held);
    let bug: Vec<String> = options.bug.map(|b| vec!["--bug".into(), b.name().into()]).unwrap_or_default();
    let api_args = vec!["api".into(), "--db".into(), db_for("api"), "--listen".into(), api_addr.to_string()];
    let mut specs = vec![NodeSpec::args(api_node(), [api_args, bug.clone()].concat())];
    let mut endpoints = vec![(api_node(), format!("http://{api_addr}"))];
    // The broker first, so that it is up by the time its clients connect;
    // each client reaches it through a fault proxy of its own.
    let clients: Vec<&String> = names.iter().filter(|n| **n != api_node().name).collect();
    let wired = match transport.server() {
        Some(server) => {
            let wired = local_broker(options, server, run_dir, &clients).await?;
            for (i, laid) in wired.side.laid.iter().enumerate() {
                specs.insert(i, laid.spec.clone());
            }
            Some(wired)
        }
        None => None,
    };
    let broker_for = |name: &str| -> Vec<String> {
        match wired.as_ref().and_then(|w| w.url_for(name)) {
            Some(url) => vec!["--transport".into(), transport.to_string(), "--broker".into(), url.to_owned()],
            None => Vec::new(),
        }
    };
    if transport.is_broker() {
        let node = relay_node();
        let (metrics, held) = reserve_port()?;
        reserved.push(held);
        endpoints.push((node.clone(), format!("http://{metrics}")));
        let mut args = vec!["relay".into(), "--db".into(), db_for(&node.name), "--relay-id".into(), node.name.clone()];
        args.extend(["--metrics-listen".into(), metrics.to_string()]);
        args.extend(broker_for(&node.name));
        specs.push(NodeSpec::args(node, [args, bug.clone()].concat()));
    }
    for i in 1..=options.workers {
        let node = worker_node(i);
        let (metrics, held) = reserve_port()?;
        reserved.push(held);
        endpoints.push((node.clone(), format!("http://{metrics}")));
        let mut args = worker_args(options, &db_for(&node.name), &node, &metrics.to_string());
        args.extend(broker_for(&node.name));
        specs.push(NodeSpec::args(node, args));
    }
    let env = vec![("HAUNT_ADMIN_TOKEN".to_owned(), token.to_owned()), ("NO_COLOR".to_owned(), "1".to_owned())];
    let services: Arc<dyn Backend> = Arc::new(LocalBackend::new(options.exe.clone(), run_dir.join("logs"), env, specs));
    let backend = match &options.pg_data {
        Some(data) => Arc::new(Joined::new(vec![services, Arc::new(PgServer::new(data)?)])),
        None => services,
    };
    let client_proxy = Arc::new(FaultProxy::start(api_addr).await?);
    // Every port is chosen and every proxy listens: the services may bind theirs.
    drop(reserved);
    let mut all: Vec<(String, SharedLink, SharedSlow)> =
        vec![("client<->api".into(), client_proxy.clone(), client_proxy.clone())];
    all.extend(proxies.into_iter().map(|(link, proxy, _)| (link, proxy.clone() as SharedLink, proxy as SharedSlow)));
    let mut cut_only: Vec<(String, SharedLink)> = Vec::new();
    let broker = wired.map(|w| {
        all.extend(w.links.into_iter().map(|(link, g)| (link, g.clone() as SharedLink, g as SharedSlow)));
        cut_only.extend(w.leader.map(|l| ("leader<->all".to_owned(), l as SharedLink)));
        w.side
    });
    let client = Arc::new(HttpClient::new(&format!("http://{}", client_proxy.addr()), options.request_timeout)?);
    let surfaces = Surfaces {
        node_faults: crate::core::system::by_role(&backend.nodes()),
        backend,
        links: all.iter().map(|(n, l, _)| (n.clone(), l.clone())).chain(cut_only).collect(),
        slowable: all.iter().map(|(n, _, s)| (n.clone(), s.clone())).collect(),
        lossy: Vec::new(),
        switches: Some(switches(token, &endpoints)?),
        // The API's kills aimed from the client's side.
        in_flight: vec![(api_node().name, client.in_flight())],
        probes: Vec::new(),
    };
    Ok(Pipeline { surfaces, store, db: db.to_string(), client, endpoints, broker })
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
    if options.ack_in_txn {
        args.push("--ack-in-txn".into());
    }
    if options.ack_fail_rate > 0.0 {
        args.extend(["--ack-fail-rate".into(), options.ack_fail_rate.to_string()]);
    }
    if let Some(bug) = options.bug {
        args.extend(["--bug".into(), bug.name().into()]);
    }
    args
}

/// Opens (and migrates) the run's database, which must be empty: the checker
/// judges every row against this run's history, and rows from an earlier run
/// would all look like anomalies.
async fn open_empty(db: &DbUrl) -> anyhow::Result<Store> {
    let store = Store::connect(db, StoreOptions::default()).await.with_context(|| format!("opening {db}"))?;
    anyhow::ensure!(
        store.is_empty().await?,
        "{db} already holds orders or messages; give each run a fresh, empty database"
    );
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::split_postgres_url;

    #[test]
    fn postgres_urls_split_around_host_and_port() {
        assert_eq!(
            split_postgres_url("postgres://u:p@db.local:5433/app?sslmode=disable"),
            Some(("postgres://u:p@", "db.local:5433", "/app?sslmode=disable"))
        );
        assert_eq!(split_postgres_url("postgres://localhost/app"), Some(("postgres://", "localhost", "/app")));
        assert_eq!(split_postgres_url("postgres:///app?host=/tmp"), None);
    }
}
