//! The reference pipeline as containers: PostgreSQL, the broker, the API,
//! the relay and the workers on the run's network, their links cut or made
//! lossy by iptables inside it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use haunt_store::DbUrl;

use super::{BrokerSide, Pipeline, open_empty, switches, worker_args};
use crate::backends::docker::{ContainerSpec, DockerBackend, IptablesLink, Peer, postgres_node};
use crate::backends::local::{api_node, relay_node, worker_node};
use crate::backends::proxy::FaultProxy;
use crate::core::link::{SharedLink, SharedLossy, SharedSlow};
use crate::core::options::RunOptions;
use crate::core::roles::{Backend, Node};
use crate::core::system::Surfaces;
use crate::core::workload::HttpClient;
use crate::systems::brokers::{Broker, BrokerNode};

/// The Docker layout: a PostgreSQL container (started and healthy when this
/// returns, with the run's store open on it), the API and the workers
/// (created), links cut or made lossy by iptables in the containers.
pub(super) async fn docker_pipeline(
    options: &RunOptions,
    run_id: &str,
    token: &str,
    run_dir: &Path,
) -> anyhow::Result<Pipeline> {
    const METRICS_PORT: u16 = 9090;
    let transport = options.transport;
    let pg = postgres_node();
    let pg_host = format!("haunt-{run_id}-{}", pg.name);
    let db_inside = format!("postgres://postgres@{pg_host}:5432/postgres");
    // Held until every port is chosen, so that no two are the same; below
    // the ephemeral range, as the engine binds them only as each container
    // starts (`publishable_port`).
    let mut reserved = Vec::new();
    let mut port = || -> anyhow::Result<u16> {
        let (port, held) = crate::systems::brokers::publishable_port()?;
        reserved.push(held);
        Ok(port)
    };
    let pg_port = port()?;
    let api_port = port()?;
    let common_env = vec![("HAUNT_ADMIN_TOKEN".to_owned(), token.to_owned()), ("NO_COLOR".to_owned(), "1".to_owned())];
    let bug: Vec<String> = options.bug.map(|b| vec!["--bug".into(), b.name().into()]).unwrap_or_default();
    let api_args =
        vec!["api".into(), "--db".into(), db_inside.clone(), "--listen".into(), format!("0.0.0.0:{DOCKER_API_PORT}")];
    let mut specs = vec![
        // The one node waited healthy; the nemesis never pauses it.
        ContainerSpec {
            health_check: true,
            ..ContainerSpec::new(pg.clone(), &options.docker.postgres_image, Vec::new(), (pg_port, 5432))
        },
        ContainerSpec {
            env: common_env.clone(),
            ..ContainerSpec::new(
                api_node(),
                &options.docker.image,
                [api_args, bug.clone()].concat(),
                (api_port, DOCKER_API_PORT),
            )
        },
    ];
    let mut endpoints = vec![(api_node(), format!("http://127.0.0.1:{api_port}"))];
    // A service with metrics (the relay, a worker), healthy when they answer.
    let service = |node: Node, args: Vec<String>, metrics_port: u16| {
        let mut env = common_env.clone();
        env.push(("HAUNT_HEALTH_URL".into(), format!("http://127.0.0.1:{METRICS_PORT}/healthz")));
        ContainerSpec { env, ..ContainerSpec::new(node, &options.docker.image, args, (metrics_port, METRICS_PORT)) }
    };
    // The broker, first, with its configuration and data in the run
    // directory; the relay and the workers reach it by its node name.
    let mut broker = None;
    let mut broker_args = Vec::new();
    if transport.server().is_some() {
        let (spec, side) = docker_broker(options, run_dir, (port()?, port()?))?;
        specs.insert(0, spec);
        let port = side.first().broker.port_for_containers(DOCKER_BROKER_PORT);
        let inside = haunt_transport::url(transport, &format!("{}:{port}", side.first().spec.node.name));
        broker_args = vec!["--transport".into(), transport.to_string(), "--broker".into(), inside];
        broker = Some(side);
    }
    if transport.is_broker() {
        let node = relay_node();
        let metrics_port = port()?;
        endpoints.push((node.clone(), format!("http://127.0.0.1:{metrics_port}")));
        let mut args = vec!["relay".into(), "--db".into(), db_inside.clone(), "--relay-id".into(), node.name.clone()];
        args.extend(["--metrics-listen".into(), format!("0.0.0.0:{METRICS_PORT}")]);
        specs.push(service(node, [args, broker_args.clone(), bug.clone()].concat(), metrics_port));
    }
    for i in 1..=options.workers {
        let node = worker_node(i);
        let metrics_port = port()?;
        endpoints.push((node.clone(), format!("http://127.0.0.1:{metrics_port}")));
        let args = worker_args(options, &db_inside, &node, &format!("0.0.0.0:{METRICS_PORT}"));
        specs.push(service(node, [args, broker_args.clone()].concat(), metrics_port));
    }
    // Released for the engine, which binds them when the containers start.
    drop(reserved);
    let mount = options.docker.mount_exe.then(|| options.exe.clone());
    let docker = Arc::new(DockerBackend::create(run_id, mount, specs, &options.docker.image).await?);
    docker.start(&pg).await?;
    docker.wait_healthy(&pg, Duration::from_secs(90)).await?;
    let db = DbUrl::parse(&format!("postgres://postgres@127.0.0.1:{pg_port}/postgres"))?;
    let store = open_empty(&db).await?;

    let lossy = docker_links(&docker, options, broker.as_ref());
    let api_addr: SocketAddr = ([127, 0, 0, 1], api_port).into();
    let client_proxy = Arc::new(FaultProxy::start(api_addr).await?);
    let client = Arc::new(HttpClient::new(&format!("http://{}", client_proxy.addr()), options.request_timeout)?);
    let surfaces = Surfaces {
        node_faults: crate::core::system::by_role(&docker.nodes()),
        backend: docker,
        slowable: vec![("client<->api".into(), client_proxy.clone() as SharedSlow)],
        links: lossy.iter().map(|(n, l)| (n.clone(), l.clone() as SharedLink)).collect(),
        lossy: lossy.into_iter().map(|(n, l)| (n, l as SharedLossy)).collect(),
        switches: Some(switches(token, &endpoints)?),
        // The API's kills aimed from the client's side.
        in_flight: vec![(api_node().name, client.in_flight())],
        probes: Vec::new(),
    };
    Ok(Pipeline { surfaces, store, db: db.to_string(), client, endpoints, broker })
}

/// The API's port in its container.
const DOCKER_API_PORT: u16 = 8080;
/// The broker's ports in its container (RabbitMQ's distribution port is the
/// first + 20000, so it must stay below 45536).
const DOCKER_BROKER_PORT: u16 = 7000;
const DOCKER_BROKER_HTTP_PORT: u16 = 7001;

/// The run's broker as a container, published on `host_ports` (its port and
/// its HTTP port), with its configuration and data in the run directory.
fn docker_broker(
    options: &RunOptions,
    run_dir: &Path,
    host_ports: (u16, u16),
) -> anyhow::Result<(ContainerSpec, BrokerSide)> {
    let transport = options.transport;
    let server = transport.server().with_context(|| format!("{transport} has no broker server"))?;
    let server = Broker::from_name(server).with_context(|| format!("no broker server for {transport}"))?;
    let (host_port, host_http_port) = host_ports;
    let (spec, dir) = server.layout_in_container(
        DOCKER_BROKER_PORT,
        DOCKER_BROKER_HTTP_PORT,
        &run_dir.join("broker"),
        Some(options.visibility_timeout),
        host_port,
    )?;
    let program = spec.program.clone().expect("a broker names its program");
    let container = ContainerSpec {
        node: spec.node.clone(),
        image: options.docker.brokers_image.clone(),
        args: std::iter::once(program.display().to_string()).chain(spec.args.iter().cloned()).collect(),
        env: spec.env.clone(),
        ports: vec![(host_port, DOCKER_BROKER_PORT), (host_http_port, DOCKER_BROKER_HTTP_PORT)],
        mounts: vec![dir.clone()],
        workdir: Some(dir),
        health_check: false,
    };
    let laid = BrokerNode {
        broker: server,
        ready: server.ready(host_port, host_http_port),
        addr: ([127, 0, 0, 1], host_port).into(),
        spec,
    };
    let side = BrokerSide::new(options, vec![laid]);
    Ok((container, side))
}

/// The Docker layout's links, each cut or made lossy by iptables: the
/// client's to the API, every service's to the database, and the relay's and
/// the workers' to the broker.
fn docker_links(
    docker: &Arc<DockerBackend>,
    options: &RunOptions,
    broker: Option<&BrokerSide>,
) -> Vec<(String, Arc<IptablesLink>)> {
    let (api, pg) = (api_node(), postgres_node());
    let mut lossy = vec![(
        "client<->api".to_owned(),
        Arc::new(IptablesLink::new(docker.clone(), api.clone(), Peer::Host { port: DOCKER_API_PORT })),
    )];
    let relay = options.transport.is_broker().then(relay_node);
    let clients: Vec<Node> =
        std::iter::once(api.clone()).chain(relay).chain((1..=options.workers).map(worker_node)).collect();
    for node in &clients {
        let link = IptablesLink::new(docker.clone(), node.clone(), Peer::Node(pg.clone()));
        lossy.push((format!("{}<->db", node.name), Arc::new(link)));
    }
    if let Some(broker) = broker {
        for node in clients.iter().filter(|n| n.name != api.name) {
            let link = IptablesLink::new(docker.clone(), node.clone(), Peer::Node(broker.first().spec.node.clone()));
            lossy.push((format!("{}<->broker", node.name), Arc::new(link)));
        }
    }
    lossy
}
