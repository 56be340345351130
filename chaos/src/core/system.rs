//! The seam between the harness and a system under test: what a run needs from
//! a system, whoever built it. The reference pipeline (`crate::systems::pipeline`) is
//! one implementation; a system described by a file and the broker transports
//! are the next, and the run's sequence (`crate::core::run`) does not change for them.
//!
//! A system offers:
//! - its nodes, through a [`Backend`] (start, stop, kill, pause);
//! - what faults can reach: the links that can be cut, slowed or made lossy,
//!   and the services' fault switches, if it has them ([`Surfaces`]);
//! - how a client places one order ([`System::client`]);
//! - when it is ready, and when it is quiet (nothing left to deliver);
//! - how to read its final state, as `final-state.jsonl` lines.

use std::sync::Arc;
use std::time::Duration;

use haunt_format::FinalLine;

use crate::core::admin::Admin;
use crate::core::fault::Fault;
use crate::core::inflight::{InFlight, WorkProbe};
use crate::core::link::{SharedLink, SharedLossy, SharedSlow};
use crate::core::roles::{Backend, BoxFuture, Client, Node, Role};

/// What faults can reach in a system.
#[derive(Debug)]
pub struct Surfaces {
    /// The nodes, and what can be done to them.
    pub backend: Arc<dyn Backend>,
    /// The nodes each node fault (kill, pause, db-restart) may hit.
    pub node_faults: Vec<(Fault, Vec<Node>)>,
    /// Links that can be cut, by name (`client<->api`, `worker-1<->db`).
    pub links: Vec<(String, SharedLink)>,
    /// Links that can be slowed down (through a fault proxy).
    pub slowable: Vec<(String, SharedSlow)>,
    /// Links that can lose packets at random (iptables in a container).
    pub lossy: Vec<(String, SharedLossy)>,
    /// The services' fault switches (`POST /admin/faults`), if they have them.
    pub switches: Option<Switches>,
    /// The nodes the workload's client calls, with its requests in flight
    /// at each: a kill or pause of one that offers no hold point is aimed
    /// from there.
    pub in_flight: Vec<(String, Arc<InFlight>)>,
    /// The nodes with a probe that says when they hold work (a system
    /// file's `aim`): a kill or pause of one without hold points waits for it.
    pub probes: Vec<(String, Arc<dyn WorkProbe>)>,
}

impl Surfaces {
    /// Only nodes, each taking the faults of its role (see [`by_role`]):
    /// nothing to cut, slow or switch.
    pub fn nodes_only(backend: Arc<dyn Backend>) -> Surfaces {
        let node_faults = by_role(&backend.nodes());
        Surfaces {
            backend,
            node_faults,
            links: Vec::new(),
            slowable: Vec::new(),
            lossy: Vec::new(),
            switches: None,
            in_flight: Vec::new(),
            probes: Vec::new(),
        }
    }

    /// The nodes `fault` may hit (none for a fault of links or switches).
    pub fn nodes_for(&self, fault: Fault) -> Vec<Node> {
        self.node_faults.iter().find(|(f, _)| *f == fault).map(|(_, nodes)| nodes.clone()).unwrap_or_default()
    }
}

/// The reference pipeline's node faults: the API and the workers can be
/// killed, the relay too (`relay-kill`), the workers and the broker paused
/// (the API holds no lease to outlive), the database and the broker crashed
/// and restarted.
pub fn by_role(nodes: &[Node]) -> Vec<(Fault, Vec<Node>)> {
    let with = |roles: &[Role]| nodes.iter().filter(|n| roles.contains(&n.role)).cloned().collect();
    vec![
        (Fault::Kill, with(&[Role::Api, Role::Worker])),
        (Fault::RelayKill, with(&[Role::Relay])),
        (Fault::Pause, with(&[Role::Worker, Role::Broker])),
        (Fault::DbRestart, with(&[Role::Database])),
        (Fault::BrokerRestart, with(&[Role::Broker])),
    ]
}

/// The admin endpoints of a system's nodes (`docs/admin.md`): which nodes
/// take each switch fault, and which a kill or a pause aims through a hold
/// point.
#[derive(Debug, Clone)]
pub struct Switches {
    /// For each switch fault (`ack-loss`, `db-error`, `clock-skew`,
    /// `stall`), the nodes that take it.
    pub by_fault: Vec<(Fault, Admin)>,
    /// The nodes whose work a kill or a pause waits for.
    pub holds: Admin,
}

impl Switches {
    /// The nodes that take `fault` through their switches, if any do.
    pub fn for_fault(&self, fault: Fault) -> Option<&Admin> {
        self.by_fault.iter().find(|(f, a)| *f == fault && !a.nodes.is_empty()).map(|(_, a)| a)
    }
}

/// Where a line of the final state goes.
pub type FinalSink<'a> = dyn FnMut(FinalLine) -> std::io::Result<()> + Send + 'a;

/// A system under test, as a run drives it.
pub trait System: Send + Sync + std::fmt::Debug {
    /// What faults can reach: nodes, links, switches.
    fn surfaces(&self) -> &Surfaces;
    /// How a client places one order.
    fn client(&self) -> Arc<dyn Client>;
    /// Waits until every node (started by the run) takes work, or says which
    /// did not.
    fn ready(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// Whether nothing is left to deliver: the run reads the final state once
    /// the system is quiet, or its quiesce timeout passed.
    fn is_quiet(&self) -> BoxFuture<'_, anyhow::Result<bool>>;

    /// What the system tells of itself as each fault strikes, for the
    /// history (a Kafka cluster's partition leaders); none by default.
    fn fault_context(&self) -> Option<Arc<dyn FaultContext>> {
        None
    }
    /// Reads the final state, every line into `sink`, the `meta` line excepted
    /// (the run writes that).
    fn read_final_state<'a>(&'a self, sink: &'a mut FinalSink<'_>) -> BoxFuture<'a, anyhow::Result<()>>;
    /// How many messages the system still holds that its final state could
    /// not name (a broker that only counts): the meta line's `unlisted`.
    /// Read after [`System::read_final_state`].
    fn unlisted(&self) -> BoxFuture<'_, anyhow::Result<u64>> {
        Box::pin(async { Ok(0) })
    }
    /// Whether the final state holds a ledger of applications (`applied`
    /// lines); without one the checker judges from the projection alone.
    fn has_ledger(&self) -> bool {
        true
    }
    /// The metrics endpoints of its nodes: the node and the base URL that
    /// serves `/metrics` (for the progress line and Prometheus).
    fn metrics(&self) -> Vec<(Node, String)> {
        Vec::new()
    }
    /// What `run.json` records as the run's database (a URL, or a name).
    fn database(&self) -> String;
    /// Lets go of what the run holds of the system (a database pool) before
    /// the backend tears the nodes down.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// What a system tells of itself when a fault strikes, recorded in the
/// fault's start op: a Kafka cluster's partition leaders, so that a report
/// can say whether a cut isolated a leader.
pub trait FaultContext: Send + Sync + std::fmt::Debug {
    /// Fields to add to the start op's value; `None` when it cannot tell.
    fn at_fault(&self) -> BoxFuture<'_, Option<serde_json::Map<String, serde_json::Value>>>;
}

/// Polls a readiness probe until it answers: an `http://` URL (any 2xx) or
/// `tcp://HOST:PORT` (a connection). Gives up after `limit`, or at once when
/// `alive` says the process is gone; the error is the last answer (refused, a
/// timeout, or the service's own status and reason).
pub async fn wait_ready(url: &str, limit: Duration, alive: impl Fn() -> bool) -> Result<(), String> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(1)).build().map_err(|e| e.to_string())?;
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let last = match url.strip_prefix("tcp://") {
            Some(addr) => match tokio::net::TcpStream::connect(addr).await {
                Ok(_) => return Ok(()),
                Err(e) => e.to_string(),
            },
            None => match http.get(url).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default().trim()),
                Err(e) => format!("{e:#}"),
            },
        };
        if tokio::time::Instant::now() >= deadline || !alive() {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
