//! haunt's reference pipeline started the way a team starts its own system in
//! a test: each service a testcontainers container from its image, on a
//! network of the test. haunt then adopts the containers by id (see
//! [`Shop::system`]) and faults them where they are.
//!
//! This file is shared: haunt's own test suite includes it too.

use std::path::Path;

use testcontainers::core::{ContainerPort, Mount, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

/// PostgreSQL, the API and the workers of one shop. Dropping it removes the
/// containers and the network (testcontainers does).
pub struct Shop {
    pub postgres: ContainerAsync<GenericImage>,
    pub api: ContainerAsync<GenericImage>,
    pub workers: Vec<ContainerAsync<GenericImage>>,
}

/// A free port on the host. A node that haunt kills keeps its published port
/// when it restarts only if the port was fixed.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// What varies between the shops of the tests.
#[derive(Default)]
pub struct ShopOptions<'a> {
    /// A known mistake the services make (`--bug`), such as `no-inbox`.
    pub bug: Option<&'a str>,
    /// The share of acks the workers lose (`--ack-fail-rate`).
    pub ack_fail_rate: Option<f64>,
    /// A `haunt` executable to run instead of the image's.
    pub haunt: Option<&'a Path>,
}

impl Shop {
    /// Starts the shop and waits until every service is healthy. `tag` tells
    /// the containers of this test from any other's.
    pub async fn start(tag: &str, options: ShopOptions<'_>) -> Shop {
        let network = format!("shop-{tag}-{}", std::process::id());
        let pg_name = format!("{network}-postgres");
        let db = format!("postgres://postgres@{pg_name}:5432/postgres");
        let mut extra: Vec<String> = Vec::new();
        if let Some(bug) = options.bug {
            extra.extend(["--bug".into(), bug.into()]);
        }
        let service = |name: &str| {
            let image = GenericImage::new("haunt", "latest")
                .with_wait_for(WaitFor::healthcheck())
                .with_network(&network)
                .with_container_name(format!("{network}-{name}"));
            match options.haunt {
                Some(exe) => image.with_mount(Mount::bind_mount(exe.to_string_lossy(), "/usr/local/bin/haunt")),
                None => image,
            }
        };
        let postgres = GenericImage::new("haunt-postgres", "latest")
            .with_wait_for(WaitFor::healthcheck())
            .with_network(&network)
            .with_container_name(&pg_name)
            .with_mapped_port(free_port(), ContainerPort::Tcp(5432))
            .start()
            .await
            .expect("haunt-postgres:latest starts (scripts/images builds it)");
        let api = service("api")
            .with_mapped_port(free_port(), ContainerPort::Tcp(8080))
            .with_cmd(
                [&["api".into(), "--db".into(), db.clone(), "--listen".into(), "0.0.0.0:8080".into()], &extra[..]]
                    .concat(),
            )
            .start()
            .await
            .expect("haunt:latest starts the API (scripts/images builds it)");
        if let Some(rate) = options.ack_fail_rate {
            extra.extend(["--ack-fail-rate".into(), rate.to_string()]);
        }
        let mut workers = Vec::new();
        for n in 1..=2 {
            let id = format!("worker-{n}");
            let args = ["worker", "--db", &db, "--worker-id", &id, "--visibility-timeout-ms", "1000"];
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let worker = service(&id)
                .with_env_var("HAUNT_HEALTH_URL", "http://127.0.0.1:9090/healthz")
                .with_cmd([&args[..], &["--metrics-listen".into(), "0.0.0.0:9090".into()], &extra[..]].concat())
                .start()
                .await
                .expect("haunt:latest starts a worker");
            workers.push(worker);
        }
        Shop { postgres, api, workers }
    }

    /// The shop in the system file's words, every node a container of this
    /// test adopted by id: what haunt may do to each (`faults`), the links
    /// it may cut (`links`), how a client places an order, and the SQL that
    /// reads the result.
    pub fn system(&self) -> String {
        let mut text = format!(
            r#"name = "shop"

[[node]]
name = "postgres"
container = "{postgres}"
port = 5432
faults = ["kill"]

[[node]]
name = "api"
container = "{api}"
port = 8080
links = ["postgres"]
faults = ["kill"]
"#,
            postgres = self.postgres.id(),
            api = self.api.id()
        );
        for (i, worker) in self.workers.iter().enumerate() {
            text.push_str(&format!(
                r#"
[[node]]
name = "worker-{n}"
container = "{id}"
links = ["postgres"]
faults = ["kill", "pause"]
"#,
                n = i + 1,
                id = worker.id()
            ));
        }
        text.push_str(
            r#"
[client]
url = "http://{addr:api}/orders"
headers = { content-type = "application/json" }
body = '{"order_id": "{order_id}", "item_id": "{item_id}", "qty": {qty}}'
ok = [200, 201]
fail = [400, 409, 422]
event_id = "/event_id"

[final_state]
database = "postgres://postgres@127.0.0.1:{port:postgres}/postgres"
orders = "SELECT order_id, item_id, qty, event_id FROM orders"
projection = "SELECT item_id, reserved_qty FROM inventory_projection"
applied = "SELECT event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms FROM projection_ledger"
pending = "SELECT message_id, event_id, delivery_count FROM queue_messages"
dead_letters = "SELECT message_id, event_id, delivery_count, last_error FROM dead_letters"
quiet = "SELECT count(*) = 0 FROM queue_messages"
"#,
        );
        text
    }
}
