//! The message brokers of the broker transports, each a local child process
//! on a loopback port with a data directory of its own, as the PostgreSQL
//! server of a run is. A broker is a node of the local backend (its own
//! process group), so `broker-restart` kills and restarts it and `pause`
//! stops it, with every process it started.
//!
//! `scripts/brokers` installs the servers. What each does with a lost ack,
//! and why each is started the way it is here: `docs/brokers.md`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::backends::local::{LocalBackend, NodeSpec};
pub use crate::backends::ready::Ready;
use crate::core::roles::Backend;
use crate::core::roles::{Node, Role};

/// A broker server haunt can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broker {
    RabbitMq,
    Redis,
    Nats,
    Mosquitto,
    /// moto's SQS emulator (in memory: a restart loses every queue).
    Moto,
    /// tansu, a Kafka-compatible broker on SQLite.
    Tansu,
    /// Google's Pub/Sub emulator, a Java server (in memory: a restart loses
    /// every topic and subscription).
    PubSub,
    /// Apache Kafka, one broker in KRaft mode (broker and controller in one
    /// JVM), from the jars `scripts/brokers` resolves through Maven.
    Kafka,
}

impl Broker {
    pub const ALL: [Broker; 8] = [
        Broker::RabbitMq,
        Broker::Redis,
        Broker::Nats,
        Broker::Mosquitto,
        Broker::Moto,
        Broker::Tansu,
        Broker::PubSub,
        Broker::Kafka,
    ];

    /// The broker named `name` (as [`Broker::name`] spells it).
    pub fn from_name(name: &str) -> Option<Broker> {
        Broker::ALL.into_iter().find(|b| b.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Broker::RabbitMq => "rabbitmq",
            Broker::Redis => "redis",
            Broker::Nats => "nats",
            Broker::Mosquitto => "mosquitto",
            Broker::Moto => "moto",
            Broker::Tansu => "tansu",
            Broker::PubSub => "pubsub-emulator",
            Broker::Kafka => "kafka",
        }
    }

    /// The server's executable and where it is looked for.
    fn candidates(self) -> Vec<PathBuf> {
        let on_path = |name: &str| -> Vec<PathBuf> {
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect())
                .unwrap_or_default()
        };
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
        match self {
            // The real server script: /usr/sbin/rabbitmq-server switches user
            // and logs under /var/log.
            Broker::RabbitMq => vec![PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server")],
            Broker::Redis => [on_path("redis-server"), vec!["/usr/bin/redis-server".into()]].concat(),
            Broker::Nats => [on_path("nats-server"), vec!["/usr/local/bin/nats-server".into()]].concat(),
            Broker::Mosquitto => [on_path("mosquitto"), vec!["/usr/sbin/mosquitto".into()]].concat(),
            Broker::Moto => [on_path("moto_server"), vec!["/usr/local/bin/moto_server".into()]].concat(),
            Broker::Tansu => [on_path("tansu"), vec![home.join(".cargo/bin/tansu")]].concat(),
            // The Debian package google-cloud-cli-pubsub-emulator puts it
            // under the SDK's platform directory, never on PATH.
            Broker::PubSub => [
                on_path("cloud-pubsub-emulator"),
                vec![
                    PUBSUB_EMULATOR.into(),
                    home.join("google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"),
                ],
            ]
            .concat(),
            // Not an executable: the broker's jar, in the directory of jars
            // that the JVM's class path takes whole.
            Broker::Kafka => {
                let cache = std::env::var_os("XDG_CACHE_HOME").map_or_else(|| home.join(".cache"), PathBuf::from);
                let dirs = [std::env::var_os("HAUNT_KAFKA_LIBS").map(PathBuf::from), Some(cache.join(KAFKA_LIBS))];
                dirs.into_iter().flatten().map(|d| d.join(KAFKA_JAR)).collect()
            }
        }
    }

    /// Whether each client needs a listener of its own. A Kafka client asks
    /// any broker where the partitions' leaders are and connects to the
    /// address the leader advertises, so a fault proxy in front of the
    /// broker's port would carry only the first request: each client gets a
    /// listener that advertises its own proxy.
    pub fn listener_per_client(self) -> bool {
        self == Broker::Kafka
    }

    /// The server's executable, or what to do when it is missing.
    pub fn program(self) -> anyhow::Result<PathBuf> {
        self.candidates().into_iter().find(|p| p.is_file()).with_context(|| {
            format!("the {} server is not installed: scripts/brokers installs it (see docs/brokers.md)", self.name())
        })
    }

    /// How long a start may take before the broker answers (RabbitMQ boots
    /// an Erlang node: 7 to 15 s on 2 cores; the Pub/Sub emulator a JVM, 2
    /// to 15 s).
    pub fn start_limit(self) -> Duration {
        match self {
            Broker::RabbitMq | Broker::PubSub | Broker::Kafka => Duration::from_secs(60),
            _ => Duration::from_secs(20),
        }
    }

    /// Lays the broker out in `dir` (its configuration and data) to listen on
    /// 127.0.0.1:`port`; `http_port` is a second port for the brokers that
    /// answer health checks on one (NATS).
    ///
    /// `ack_timeout` is for a broker that has no visibility timeout of its
    /// own: how long a consumer may hold a delivery unacked before the broker
    /// takes it back. RabbitMQ's `consumer_timeout` is that (it closes the
    /// channel, which requeues what it held); `None` keeps its default of 30
    /// minutes, under which a lost ack on a live channel is never redelivered
    /// within a run. The other brokers take it from their clients.
    ///
    /// `clients` are the listeners of a broker that has one per client
    /// ([`Broker::listener_per_client`]); without them its clients connect
    /// to `port` directly. tansu takes at most one, whose address it
    /// advertises (the proxy its clients share).
    pub fn layout(
        self,
        port: u16,
        http_port: u16,
        dir: &Path,
        ack_timeout: Option<Duration>,
        clients: &[ClientListener],
    ) -> anyhow::Result<BrokerNode> {
        self.layout_in(port, http_port, dir, ack_timeout, clients, &KafkaPlace::alone())
    }

    /// [`Broker::layout`] of one node of a Kafka cluster, at its `place`.
    pub fn layout_in(
        self,
        port: u16,
        http_port: u16,
        dir: &Path,
        ack_timeout: Option<Duration>,
        clients: &[ClientListener],
        place: &KafkaPlace,
    ) -> anyhow::Result<BrokerNode> {
        let program = self.program()?;
        let (mut spec, _) = self.lay_out(port, http_port, dir, "127.0.0.1", &program, ack_timeout, clients, place)?;
        let ready = self.ready(port, http_port);
        // A broker-restart is over once the broker answers again.
        spec.ready = Some((ready.clone(), self.start_limit()));
        Ok(BrokerNode { broker: self, spec, ready, addr: ([127, 0, 0, 1], port).into() })
    }

    /// [`Broker::layout`] for a container of `haunt-brokers:latest`
    /// (`docker/brokers`): listening on every interface of the container at
    /// `port` (and `http_port`), its configuration and data in `dir`, which
    /// the container mounts at the same path. `published`: the host port
    /// `port` is published on, for a broker that tells its clients where to
    /// connect (Kafka). Returns the spec to run (the program first in its
    /// arguments) and the working directory.
    pub fn layout_in_container(
        self,
        port: u16,
        http_port: u16,
        dir: &Path,
        ack_timeout: Option<Duration>,
        published: u16,
    ) -> anyhow::Result<(NodeSpec, PathBuf)> {
        if self == Broker::Kafka {
            return kafka_in_container(port, http_port, dir, published);
        }
        let program = PathBuf::from(match self {
            Broker::RabbitMq => "/usr/lib/rabbitmq/bin/rabbitmq-server",
            Broker::Redis => "/usr/bin/redis-server",
            Broker::Nats => "/usr/local/bin/nats-server",
            Broker::Mosquitto => "/usr/sbin/mosquitto",
            Broker::Moto => "/usr/local/bin/moto_server",
            Broker::Tansu => anyhow::bail!("tansu has no container image here (it is not in Debian or PyPI)"),
            Broker::Kafka => unreachable!("laid out above"),
            // Copied in from the host by scripts/images, where the host has it.
            Broker::PubSub => PUBSUB_EMULATOR_IN_IMAGE,
        });
        self.lay_out(port, http_port, dir, "0.0.0.0", &program, ack_timeout, &[], &KafkaPlace::alone())
    }

    /// The port in its container that the run's other containers connect to,
    /// for a broker laid out by [`Broker::layout_in_container`] at `port`:
    /// `port` itself, but for Kafka, which advertises its harness listener
    /// at the host's published port, and another listener, at the
    /// container's name, to the containers of the run.
    pub fn port_for_containers(self, port: u16) -> u16 {
        if self == Broker::Kafka { port + 2 } else { port }
    }

    /// How to tell that the broker answers on `port` (and `http_port`) of 127.0.0.1.
    pub fn ready(self, port: u16, http_port: u16) -> Ready {
        match self {
            Broker::RabbitMq => Ready::Greeting { port, send: b"AMQP\x00\x00\x09\x01", skip: 0, expect: &[1, 0, 0] },
            Broker::Redis => Ready::Greeting { port, send: b"PING\r\n", skip: 0, expect: b"+PONG" },
            Broker::Nats => Ready::Http(format!("http://127.0.0.1:{http_port}/healthz?js-enabled-only=true")),
            // CONNECT (MQTT 3.1.1, clean session, keep-alive 60 s, empty client id), then CONNACK accepted.
            Broker::Mosquitto => Ready::Greeting {
                port,
                send: b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00",
                skip: 0,
                expect: b"\x20\x02\x00\x00",
            },
            Broker::Moto => Ready::Http(format!("http://127.0.0.1:{port}/moto-api/")),
            Broker::Tansu => Ready::Tcp(port),
            // ApiVersions v0 (size, api key 18, version 0, correlation id
            // "haun", client id "haunt"), then, past the answer's size, the
            // correlation id and error code 0. An accepted connection is not
            // enough: under Docker the engine's proxy accepts on a published
            // port before the broker inside listens, and a broker still
            // starting timed out the topic's creation.
            Broker::Kafka => Ready::Greeting {
                port,
                send: b"\x00\x00\x00\x0f\x00\x12\x00\x00haun\x00\x05haunt",
                skip: 4,
                expect: b"haun\x00\x00",
            },
            // The emulator answers `GET /` with "Ok" once it serves.
            Broker::PubSub => Ready::Http(format!("http://127.0.0.1:{port}/")),
        }
    }

    /// The broker's command line, listening on `bind`, with `program` as
    /// its server; the node spec and its working directory.
    #[allow(clippy::too_many_arguments)]
    fn lay_out(
        self,
        port: u16,
        http_port: u16,
        dir: &Path,
        bind: &str,
        program: &Path,
        ack_timeout: Option<Duration>,
        clients: &[ClientListener],
        place: &KafkaPlace,
    ) -> anyhow::Result<(NodeSpec, PathBuf)> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = std::path::absolute(dir)?;
        let d = |rel: &str| dir.join(rel).to_string_lossy().into_owned();
        let node = Node { name: place.node_name(), role: Role::Broker };
        let mut env = Vec::new();
        let args: Vec<String> = match self {
            Broker::RabbitMq => {
                anyhow::ensure!(port <= 45535, "RabbitMQ's distribution port is its port + 20000: {port} is too high");
                let mut conf = format!("listeners.tcp.1 = {bind}:{port}\nloopback_users = none\n");
                // The channel checks its deliveries' age once a tick (a
                // minute by default); a tick of a quarter of the timeout
                // takes a delivery back within 1.25 times the timeout.
                let tick = ack_timeout.map_or(60_000, |t| (t.as_millis() / 4).clamp(100, 60_000));
                if let Some(t) = ack_timeout {
                    conf.push_str(&format!("consumer_timeout = {}\n", t.as_millis()));
                }
                write(&dir.join("rabbitmq.conf"), &conf)?;
                write(&dir.join("advanced.config"), &format!("[{{rabbit, [{{channel_tick_interval, {tick}}}]}}].\n"))?;
                write(&dir.join("enabled_plugins"), "[].\n")?;
                write(&dir.join("rabbitmq-env.conf"), "")?;
                std::fs::create_dir_all(dir.join("home"))?;
                for (k, v) in [
                    ("HOME", d("home")),
                    ("RABBITMQ_NODENAME", format!("haunt-{port}@localhost")),
                    ("RABBITMQ_NODE_IP_ADDRESS", bind.into()),
                    ("RABBITMQ_NODE_PORT", port.to_string()),
                    ("RABBITMQ_DIST_PORT", (u32::from(port) + 20000).to_string()),
                    ("RABBITMQ_MNESIA_BASE", d("mnesia")),
                    ("RABBITMQ_LOG_BASE", d("log")),
                    ("RABBITMQ_CONFIG_FILE", d("rabbitmq.conf")),
                    ("RABBITMQ_ADVANCED_CONFIG_FILE", d("advanced.config")),
                    ("RABBITMQ_ENABLED_PLUGINS_FILE", d("enabled_plugins")),
                    ("RABBITMQ_CONF_ENV_FILE", d("rabbitmq-env.conf")),
                    ("RABBITMQ_PID_FILE", d("pid")),
                    ("ERL_EPMD_ADDRESS", "127.0.0.1".into()),
                    // A port mapper of its own, in the node's process group,
                    // instead of the shared daemon Erlang would leave behind.
                    ("ERL_EPMD_PORT", http_port.to_string()),
                    ("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", "-kernel inet_dist_use_interface {127,0,0,1}".into()),
                ] {
                    env.push((k.to_owned(), v));
                }
                let launch = format!(
                    "epmd -port {http_port} -address 127.0.0.1 & \
                     for _ in $(seq 100); do epmd -port {http_port} -names >/dev/null 2>&1 && break; sleep 0.1; done; \
                     exec {}",
                    program.display()
                );
                vec!["-c".into(), launch]
            }
            Broker::Redis => {
                let args = ["--port", &port.to_string(), "--bind", bind, "--dir", &d(""), "--appendonly", "yes"];
                let more = ["--appendfsync", "always", "--save", "", "--daemonize", "no"];
                // Off the loopback, Redis refuses clients without a password
                // unless told that the network is private (a container's is).
                let open = if bind == "127.0.0.1" { &[][..] } else { &["--protected-mode", "no"][..] };
                args.iter().chain(&more).chain(open).map(|s| s.to_string()).collect()
            }
            Broker::Nats => {
                let (p, m) = (port.to_string(), http_port.to_string());
                ["-a", bind, "-p", &p, "-m", &m, "-js", "-sd", &d("js"), "-n", "haunt-nats"].map(String::from).to_vec()
            }
            Broker::Mosquitto => {
                // Saved after every change: mosquitto keeps its store in memory
                // and writes it only on autosave or shutdown.
                let conf = format!(
                    "listener {port} {bind}\nallow_anonymous true\nuser root\npersistence true\n\
                     persistence_location {}/\nautosave_interval 1\nautosave_on_changes true\nmax_queued_messages 0\n",
                    dir.display()
                );
                write(&dir.join("mosquitto.conf"), &conf)?;
                vec!["-c".into(), d("mosquitto.conf")]
            }
            Broker::Moto => {
                // moto's delete under its queue's lock: see MOTO_DELETE_LOCKED.
                let python = dir.join("python");
                std::fs::create_dir_all(&python)?;
                write(&python.join("sitecustomize.py"), MOTO_DELETE_LOCKED)?;
                env.push(("PYTHONPATH".to_owned(), d("python")));
                vec!["-H".into(), bind.into(), "-p".into(), port.to_string()]
            }
            Broker::Tansu => {
                // One listener, so one address to advertise: its own, or
                // the one client listener's (a run's shared proxy).
                anyhow::ensure!(clients.len() <= 1, "tansu advertises one address, not one per client");
                let listener = format!("tcp://{bind}:{port}");
                let advertised =
                    clients.first().map_or_else(|| listener.clone(), |c| format!("tcp://{}", c.advertised));
                let args = ["broker", "--listener-url", &listener, "--advertised-listener-url", &advertised];
                // Relative to its working directory, the data directory.
                args.iter().chain(&["--storage-engine", "sqlite://tansu.db"]).map(|s| s.to_string()).collect()
            }
            Broker::PubSub => {
                // The launcher runs `java` with these options: a capped heap,
                // and Netty on the heap rather than its pooled direct memory.
                env.push(("CLOUD_PUBSUB_EMULATOR_OPTS".to_owned(), PUBSUB_JVM_OPTS.to_owned()));
                vec![format!("--host={bind}"), format!("--port={port}")]
            }
            Broker::Kafka => {
                let libs = program.parent().context("the Kafka jar's directory")?;
                let props = kafka_properties(port, http_port, &d("data"), clients, place);
                write(&dir.join("server.properties"), &props)?;
                write(&dir.join("log4j2.properties"), KAFKA_LOG4J)?;
                vec!["-c".into(), kafka_launch(libs)]
            }
        };
        let program = match self {
            Broker::RabbitMq | Broker::Kafka => PathBuf::from("/bin/sh"),
            _ => program.to_owned(),
        };
        let spec = NodeSpec { node, args, program: Some(program), env, cwd: Some(dir.clone()), ready: None };
        Ok((spec, dir))
    }
}

/// Where `scripts/brokers` puts Apache Kafka's jars, under the user's
/// cache directory (`HAUNT_KAFKA_LIBS` names another), and the broker's jar
/// among them.
pub const KAFKA_LIBS: &str = "haunt/kafka-4.4.0/libs";
const KAFKA_JAR: &str = "kafka_2.13-4.4.0.jar";

/// The cluster id every Kafka broker of haunt's is formatted with (any
/// base64 UUID; each run has a data directory of its own).
const KAFKA_CLUSTER_ID: &str = "qddpKkUXTpqtZ1JZ00_rZA";

/// The broker's log configuration (log4j 2).
const KAFKA_LOG4J: &str = include_str!("kafka/log4j2.properties");

/// A listener of a broker for one client, which reaches it through its
/// fault proxy: the broker listens on `port` and advertises `advertised`,
/// the proxy's address (see [`Broker::listener_per_client`]).
#[derive(Debug, Clone)]
pub struct ClientListener {
    /// The client's node (`relay`, `worker-1`).
    pub client: String,
    pub port: u16,
    pub advertised: SocketAddr,
}

impl ClientListener {
    /// The listener's name in Kafka's configuration: `CLIENT_WORKER_1`.
    fn name(&self) -> String {
        let upper: String =
            self.client.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
        format!("CLIENT_{upper}")
    }
}

/// One Kafka node in KRaft mode, broker and controller in one process: the
/// harness's listener on `port`, the controller's on `controller_port`, one
/// per client, and in a cluster one per node (`FROM_<id>`), each advertised
/// at the address that node reaches it by (its fault proxy), so that every
/// byte between two brokers crosses a proxy of their pair. A node replicates
/// over its own `FROM_` listener name, and reaches the other controllers
/// through its proxies too.
/// Every setting that decides what a run can show is here: a copy of
/// everything on every node (one alone; three in a cluster, where
/// `min.insync.replicas` is 2, so that an `acks=all` write outlives a
/// node's loss), no unclean election, the group's first rebalance at once, the internal topics on one partition
/// (a first consumer group or transaction waits for them to be created),
/// a broker's session with its controller of 3 s instead of 9 (a broker
/// restarted after a SIGKILL waits for its old session to end), and the
/// consumer group's settings, which Kafka's consumer protocol (KIP-848) takes
/// from the broker, not the client:
/// - `group.consumer.session.timeout.ms` 6 s (Kafka's 45 s, its least too,
///   would keep a killed worker's partitions past the end of a short run);
/// - `group.consumer.heartbeat.interval.ms` 0.5 s (Kafka's 5 s): a partition
///   moves between members in two heartbeats, the old owner's and the new;
/// - `group.consumer.assignment.interval.ms` 0 (Kafka's 1 s): a member that
///   joins is given its partitions at its next heartbeat.
///
/// With Kafka's heartbeat, the members of a worker started a second after
/// the others were given nothing for 4 s, and a kill aimed at that worker
/// found no batch in hand.
fn kafka_properties(
    port: u16,
    controller_port: u16,
    data: &str,
    clients: &[ClientListener],
    place: &KafkaPlace,
) -> String {
    let mut listeners =
        vec![format!("HARNESS://127.0.0.1:{port}"), format!("CONTROLLER://127.0.0.1:{controller_port}")];
    let mut advertised = vec![format!("HARNESS://127.0.0.1:{port}")];
    let mut protocols = vec!["HARNESS:PLAINTEXT".to_owned(), "CONTROLLER:PLAINTEXT".to_owned()];
    let peers = place.peers.iter().map(|p| (format!("FROM_{}", p.from), p.port, p.advertised));
    let clients = clients.iter().map(|c| (c.name(), c.port, c.advertised));
    for (name, port, to) in peers.chain(clients) {
        listeners.push(format!("{name}://127.0.0.1:{port}"));
        advertised.push(format!("{name}://{to}"));
        protocols.push(format!("{name}:PLAINTEXT"));
    }
    let voters = if place.voters.is_empty() {
        format!("1@127.0.0.1:{controller_port}")
    } else {
        place.voters.iter().map(|(id, addr)| format!("{id}@{addr}")).collect::<Vec<_>>().join(",")
    };
    let inter = if place.peers.is_empty() { "HARNESS".to_owned() } else { format!("FROM_{}", place.id) };
    format!(
        "node.id={}\ncontroller.quorum.voters={voters}\ninter.broker.listener.name={inter}\n\
         listeners={}\nadvertised.listeners={}\nlistener.security.protocol.map={}\n{}",
        place.id,
        listeners.join(","),
        advertised.join(","),
        protocols.join(","),
        kafka_settings(place.voters.len().max(1), data),
    )
}

/// The settings of a node of `copies` (1 or 3) that do not depend on where
/// it listens: replication, the group's timeouts, the data directory.
fn kafka_settings(copies: usize, data: &str) -> String {
    let insync = if copies >= 3 { 2 } else { 1 };
    format!(
        "process.roles=broker,controller\ncontroller.listener.names=CONTROLLER\nlog.dirs={data}\n\
         auto.create.topics.enable=false\ndefault.replication.factor={copies}\nmin.insync.replicas={insync}\n\
         unclean.leader.election.enable=false\ngroup.initial.rebalance.delay.ms=0\n\
         offsets.topic.replication.factor={copies}\noffsets.topic.num.partitions=1\n\
         transaction.state.log.replication.factor={copies}\ntransaction.state.log.min.isr={insync}\n\
         transaction.state.log.num.partitions=1\n\
         broker.session.timeout.ms=3000\nbroker.heartbeat.interval.ms=1000\n\
         group.consumer.session.timeout.ms=6000\ngroup.consumer.min.session.timeout.ms=6000\n\
         group.consumer.heartbeat.interval.ms=500\ngroup.consumer.min.heartbeat.interval.ms=500\n\
         group.consumer.assignment.interval.ms=0\n"
    )
}

/// Kafka alone in a container of `docker/brokers`: the harness's listener
/// on `port`, advertised at the host's `published` port; the run's other
/// containers' on `port + 2`, advertised at the container's name (the
/// broker's node name, its alias on the run's network), which is also the
/// listener between brokers; the controller on `controller_port`, inside
/// only. Links to it are cut with iptables, so no client needs a listener
/// of its own.
fn kafka_in_container(
    port: u16,
    controller_port: u16,
    dir: &Path,
    published: u16,
) -> anyhow::Result<(NodeSpec, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = std::path::absolute(dir)?;
    let place = KafkaPlace::alone();
    let name = place.node_name();
    let inside = Broker::Kafka.port_for_containers(port);
    let data = dir.join("data").to_string_lossy().into_owned();
    let props = format!(
        "node.id=1\ncontroller.quorum.voters=1@127.0.0.1:{controller_port}\ninter.broker.listener.name=INTERNAL\n\
         listeners=HARNESS://0.0.0.0:{port},INTERNAL://0.0.0.0:{inside},CONTROLLER://127.0.0.1:{controller_port}\n\
         advertised.listeners=HARNESS://127.0.0.1:{published},INTERNAL://{name}:{inside}\n\
         listener.security.protocol.map=HARNESS:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT\n{}",
        kafka_settings(1, &data),
    );
    write(&dir.join("server.properties"), &props)?;
    write(&dir.join("log4j2.properties"), KAFKA_LOG4J)?;
    let node = Node { name, role: Role::Broker };
    let args = vec!["-c".into(), kafka_launch(Path::new(KAFKA_LIBS_IN_IMAGE))];
    let spec = NodeSpec {
        node,
        args,
        program: Some(PathBuf::from("/bin/sh")),
        env: Vec::new(),
        cwd: Some(dir.clone()),
        ready: None,
    };
    Ok((spec, dir))
}

/// Where `docker/brokers` puts Kafka's jars (copied from the host's cache).
const KAFKA_LIBS_IN_IMAGE: &str = "/opt/kafka/libs";

/// A Kafka node's place in its cluster. [`KafkaPlace::alone`]: node 1, with
/// no other node.
#[derive(Debug, Clone)]
pub struct KafkaPlace {
    pub id: u32,
    /// Every node's controller as this node reaches it (its own directly,
    /// the others' through its proxies); empty alone.
    pub voters: Vec<(u32, SocketAddr)>,
    /// This node's listener for each node of the cluster, itself included.
    pub peers: Vec<PeerListener>,
}

/// A node's listener for node `from`: its `port`, advertised at the
/// address `from` reaches it by.
#[derive(Debug, Clone)]
pub struct PeerListener {
    pub from: u32,
    pub port: u16,
    pub advertised: SocketAddr,
}

impl KafkaPlace {
    pub fn alone() -> KafkaPlace {
        KafkaPlace { id: 1, voters: Vec::new(), peers: Vec::new() }
    }

    /// `broker` alone, `broker-<id>` in a cluster.
    pub fn node_name(&self) -> String {
        if self.voters.len() > 1 { format!("broker-{}", self.id) } else { "broker".to_owned() }
    }
}

/// The broker's JVM options: 512 MiB of heap at most.
const KAFKA_JVM_OPTS: &str = "-Xmx512m -Xms128m -Djava.awt.headless=true";

/// Formats the data directory (once: a restart finds it formatted) with
/// Kafka's storage tool, then runs the broker: the two Java main classes the
/// release's `kafka-storage.sh` and `kafka-server-start.sh` run.
fn kafka_launch(libs: &Path) -> String {
    let cp = format!("'{}/*'", libs.display());
    format!(
        "java {KAFKA_JVM_OPTS} -cp {cp} kafka.tools.StorageTool format -t {KAFKA_CLUSTER_ID} \
         -c server.properties --ignore-formatted && \
         exec java {KAFKA_JVM_OPTS} -Dlog4j2.configurationFile=log4j2.properties -cp {cp} kafka.Kafka server.properties"
    )
}

/// A `sitecustomize.py` that makes moto's SQS delete and receive take their
/// queue's lock, put on the PYTHONPATH of every moto that haunt starts.
/// moto 5.2 deletes a message by filtering its queue's message list outside
/// that lock, and answers requests on threads, so a message sent while a
/// delete filters is dropped after its send was confirmed: a lost effect
/// that is moto's, not the pipeline's. Its FIFO receive breaks a group's
/// order (concurrent receives, and an expired batch given back last message
/// first), which the patch also closes. `chaos/tests/it/moto_race.py`
/// forces each. The broker's log says whether the patch took.
pub const MOTO_DELETE_LOCKED: &str = include_str!("moto/sitecustomize.py");

/// Where Debian's `google-cloud-cli-pubsub-emulator` installs the emulator's launcher.
pub const PUBSUB_EMULATOR: &str = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";

/// Where `docker/brokers` puts the emulator (copied from the host's
/// [`PUBSUB_EMULATOR`]); an image built on a host without one lacks it, and
/// the broker's container then exits naming the missing file.
pub const PUBSUB_EMULATOR_IN_IMAGE: &str = "/opt/pubsub-emulator/bin/cloud-pubsub-emulator";

/// The emulator's JVM options: 512 MiB of heap at most.
const PUBSUB_JVM_OPTS: &str = "-Xmx512m -Dio.netty.noPreferDirect=true -Dio.netty.allocator.type=unpooled";

/// The line a patched moto writes to its log at start.
pub const MOTO_PATCHED_LINE: &str = "haunt: moto's SQS delete runs under the queue's lock";

/// A free loopback port for a broker, and the next one, both below the
/// kernel's ephemeral range, as is RabbitMQ's distribution port (20000
/// above the first). Below it because a broker's clients keep connecting while a
/// `broker-restart` has it down, and a connect to a free port of the
/// ephemeral range on the loopback can be given that very port as its own
/// and connect to itself; the broker then cannot listen again (RabbitMQ
/// failed to restart with `eaddrinuse` exactly so).
pub fn free_ports() -> anyhow::Result<(u16, u16)> {
    free_ports_besides(&[])
}

/// [`free_ports`], none of them one of `taken` (chosen before, and not yet
/// listened on).
pub fn free_ports_besides(taken: &[u16]) -> anyhow::Result<(u16, u16)> {
    let ephemeral_low = ephemeral_low();
    let (low, high) = (10_000u32, ephemeral_low.saturating_sub(20_001));
    anyhow::ensure!(
        high > low,
        "the ephemeral port range starts at {ephemeral_low}: no room below it for a broker's ports"
    );
    let mut rng = haunt_store::Rng::from_entropy();
    let free = |p: u32| std::net::TcpListener::bind(("127.0.0.1", p as u16)).is_ok();
    for _ in 0..200 {
        let port = low + (rng.next_u64() % u64::from(high - low)) as u32;
        let clear = [port, port + 1].iter().all(|p| !taken.iter().any(|t| u32::from(*t) == *p));
        if clear && free(port) && free(port + 1) && free(port + 20000) && hand_out(&[port as u16, port as u16 + 1]) {
            return Ok((port as u16, port as u16 + 1));
        }
    }
    anyhow::bail!("no free pair of loopback ports between {low} and {high}")
}

/// Marks `ports` as handed out by this process, if none of them was before.
/// A port is free when it is chosen, but its node binds it a while later (a
/// JVM's start takes seconds), and two nodes started at once by one process
/// (tests running side by side) could each be given it: the second then
/// cannot bind, and a check of "its" port is answered by the other's server
/// (a paused NATS seemed to answer its health check in the suite,
/// 2026-12-05). Ports are many and a process hands out a few hundred at
/// most, so none is given twice.
fn hand_out(ports: &[u16]) -> bool {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    if ports.iter().any(|p| handed.contains(p)) {
        return false;
    }
    handed.extend(ports);
    true
}

/// The first port of the kernel's ephemeral range, from which it gives
/// outgoing connections their local ports.
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()))
        .unwrap_or(32768)
}

/// A free loopback port below the kernel's ephemeral range, held by the
/// listener returned until the caller lets it go: for a port that a node
/// binds after the harness let it go, and again after every restart (a
/// port a container engine publishes, a process node's or a service's).
/// Between a release and the next bind, a port of the ephemeral range can
/// become the local port of some outgoing connection, and the node then
/// fails to start ("bind: address already in use": seen once in the suite
/// for a container, 2026-12-05; a node killed and restarted leaves its port
/// free for a second or more each time). Below the range, only a program
/// that asks for that very port can take it.
pub fn publishable_port() -> anyhow::Result<(u16, std::net::TcpListener)> {
    let high = ephemeral_low().min(u32::from(u16::MAX));
    let low = 10_000u32;
    anyhow::ensure!(high > low, "the ephemeral port range starts at {high}: no room below it to publish a port");
    let mut rng = haunt_store::Rng::from_entropy();
    for _ in 0..200 {
        let port = (low + (rng.next_u64() % u64::from(high - low)) as u32) as u16;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port))
            && hand_out(&[port])
        {
            return Ok((port, listener));
        }
    }
    anyhow::bail!("no free loopback port between {low} and {high}")
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A broker laid out for the local backend.
#[derive(Debug, Clone)]
pub struct BrokerNode {
    pub broker: Broker,
    pub spec: NodeSpec,
    pub ready: Ready,
    /// Where clients reach it.
    pub addr: SocketAddr,
}

/// One broker server started alone on loopback, as the transports'
/// contract tests and `haunt bench transport` run one: laid out in a
/// directory, started, and past its ready check; stopped when dropped.
#[derive(Debug)]
pub struct LocalServer {
    pub laid: BrokerNode,
    pub backend: LocalBackend,
}

impl LocalServer {
    /// `broker`, laid out and logging in `dir`, once it answers.
    pub async fn start(broker: Broker, dir: &Path) -> anyhow::Result<LocalServer> {
        let (port, http_port) = free_ports()?;
        let laid = broker.layout(port, http_port, &dir.join("data"), None, &[])?;
        let program = laid.spec.program.clone().context("a local broker has a program")?;
        let backend = LocalBackend::new(program, dir.to_owned(), Vec::new(), vec![laid.spec.clone()]);
        let server = LocalServer { laid, backend };
        server.backend.start(&server.laid.spec.node).await?;
        server.ready().await?;
        Ok(server)
    }

    /// Waits for the ready check; its error carries the server's log.
    pub async fn ready(&self) -> anyhow::Result<()> {
        let (node, broker) = (&self.laid.spec.node, self.laid.broker);
        if let Err(e) = self.laid.ready.wait(broker.start_limit(), || self.backend.is_running(node)).await {
            let log = std::fs::read_to_string(self.backend.log_path(node)).unwrap_or_default();
            anyhow::bail!("{} did not answer: {e}\n{log}", broker.name());
        }
        Ok(())
    }

    /// Kills the server and starts it again, up to its ready check.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.backend.kill(&self.laid.spec.node).await?;
        self.backend.start(&self.laid.spec.node).await?;
        self.ready().await
    }

    /// The URL a client of `spec` uses for it: tansu's consumers join their
    /// group the classic way, the only one it speaks.
    pub fn url(&self, spec: haunt_transport::TransportSpec) -> String {
        let url = haunt_transport::local_url(spec, self.laid.addr);
        if self.laid.broker == Broker::Tansu { format!("{url}?group=classic") } else { url }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = futures_util::FutureExt::now_or_never(self.backend.stop(&self.laid.spec.node));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node 2 of three: it replicates over its own `FROM_2` listener, is
    /// reached by node 1 and 3 at their proxies, reaches the other
    /// controllers through its own, and keeps three copies, two in sync.
    #[test]
    fn a_cluster_node_is_reached_by_each_peer_through_its_proxy() {
        let addr = |port: u16| -> SocketAddr { ([127, 0, 0, 1], port).into() };
        let peer = |from: u32, port: u16, advertised: u16| PeerListener { from, port, advertised: addr(advertised) };
        let place = KafkaPlace {
            id: 2,
            voters: vec![(1, addr(41001)), (2, addr(12010)), (3, addr(41003))],
            peers: vec![peer(1, 12101, 42001), peer(2, 12102, 12102), peer(3, 12103, 42003)],
        };
        assert_eq!(place.node_name(), "broker-2");
        assert_eq!(KafkaPlace::alone().node_name(), "broker");
        let props = kafka_properties(12000, 12010, "/d/data", &[], &place);
        let value = |key: &str| {
            props.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_else(|| panic!("{key}: {props}"))
        };
        assert_eq!(value("node.id"), "2");
        assert_eq!(value("controller.quorum.voters"), "1@127.0.0.1:41001,2@127.0.0.1:12010,3@127.0.0.1:41003");
        assert_eq!(value("inter.broker.listener.name"), "FROM_2");
        assert_eq!(
            value("advertised.listeners"),
            "HARNESS://127.0.0.1:12000,FROM_1://127.0.0.1:42001,FROM_2://127.0.0.1:12102,FROM_3://127.0.0.1:42003"
        );
        for (key, want) in [
            ("default.replication.factor", "3"),
            ("min.insync.replicas", "2"),
            ("offsets.topic.replication.factor", "3"),
            ("transaction.state.log.min.isr", "2"),
            ("unclean.leader.election.enable", "false"),
        ] {
            assert_eq!(value(key), want, "{key}");
        }
        let alone = kafka_properties(12000, 12010, "/d/data", &[], &KafkaPlace::alone());
        assert!(alone.contains("inter.broker.listener.name=HARNESS\n"), "{alone}");
        assert!(alone.contains("min.insync.replicas=1\n"), "{alone}");
    }

    #[test]
    fn each_kafka_client_has_a_listener_that_advertises_its_proxy() {
        let clients = [
            ClientListener { client: "relay".into(), port: 11001, advertised: ([127, 0, 0, 1], 40001).into() },
            ClientListener { client: "worker-1".into(), port: 11002, advertised: ([127, 0, 0, 1], 40002).into() },
        ];
        let props = kafka_properties(11000, 11010, "/d/data", &clients, &KafkaPlace::alone());
        let value = |key: &str| {
            props.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).unwrap_or_else(|| panic!("{key}: {props}"))
        };
        assert_eq!(
            value("listeners"),
            "HARNESS://127.0.0.1:11000,CONTROLLER://127.0.0.1:11010,\
             CLIENT_RELAY://127.0.0.1:11001,CLIENT_WORKER_1://127.0.0.1:11002"
        );
        // The client is told to come back through its own proxy; the
        // controller's listener is never advertised.
        assert_eq!(
            value("advertised.listeners"),
            "HARNESS://127.0.0.1:11000,CLIENT_RELAY://127.0.0.1:40001,CLIENT_WORKER_1://127.0.0.1:40002"
        );
        assert!(value("listener.security.protocol.map").contains("CLIENT_WORKER_1:PLAINTEXT"));
        assert_eq!(value("controller.quorum.voters"), "1@127.0.0.1:11010");
        assert_eq!(value("log.dirs"), "/d/data");
        for (key, want) in [("min.insync.replicas", "1"), ("unclean.leader.election.enable", "false")] {
            assert_eq!(value(key), want, "{key}");
        }
    }

    #[test]
    fn the_kafka_broker_is_formatted_once_then_run_with_a_capped_heap() {
        let launch = kafka_launch(Path::new("/cache/libs"));
        let (format, run) = launch.split_once("&&").unwrap();
        assert!(format.contains("kafka.tools.StorageTool format") && format.contains("--ignore-formatted"), "{launch}");
        assert!(run.contains("exec java -Xmx512m") && run.contains("kafka.Kafka server.properties"), "{launch}");
        assert!(launch.contains("-cp '/cache/libs/*'"), "{launch}");
    }

    #[test]
    fn no_port_is_handed_out_twice_by_one_process() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..150 {
            let (a, b) = free_ports().unwrap();
            assert!(seen.insert(a) && seen.insert(b), "{a} or {b} handed out before");
            let (p, _listener) = publishable_port().unwrap();
            assert!(seen.insert(p), "{p} handed out before");
        }
    }

    #[test]
    fn ports_chosen_for_a_broker_avoid_those_already_taken() {
        let (first, second) = free_ports().unwrap();
        for _ in 0..50 {
            let (a, b) = free_ports_besides(&[first, second]).unwrap();
            assert!(![first, second].contains(&a) && ![first, second].contains(&b), "{a} {b}");
        }
    }
}
