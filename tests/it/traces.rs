//! OTLP export: the API and a worker send spans to a receiver this test runs
//! on 127.0.0.1 (OTLP over HTTP/protobuf). Under lost acks, one order's API span
//! and its delivery attempts are one trace, with either form of worker spans.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

/// A span as received.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    /// Its trace id, hex.
    trace: String,
    attrs: HashMap<String, String>,
    /// The trace ids of the spans it links to, hex.
    links: Vec<String>,
}

/// Every span received.
type Spans = Arc<Mutex<Vec<Seen>>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn receiver() -> (u16, Spans) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let spans: Spans = Arc::default();
    let sink = spans.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let sink = sink.clone();
            std::thread::spawn(move || serve(stream, sink));
        }
    });
    (port, spans)
}

/// One HTTP/1.1 connection: POST /v1/traces with a protobuf body, answered 200.
fn serve(mut stream: std::net::TcpStream, sink: Spans) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line.trim().is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if let Ok(request) = ExportTraceServiceRequest::decode(&body[..]) {
            let mut out = sink.lock().unwrap();
            for rs in request.resource_spans {
                for ss in rs.scope_spans {
                    for span in ss.spans {
                        let attrs = span
                            .attributes
                            .iter()
                            .map(|kv| {
                                (kv.key.clone(), format!("{:?}", kv.value.as_ref().and_then(|v| v.value.clone())))
                            })
                            .collect();
                        let links = span.links.iter().map(|l| hex(&l.trace_id)).collect();
                        out.push(Seen { name: span.name.clone(), trace: hex(&span.trace_id), attrs, links });
                    }
                }
            }
        }
        let _ =
            stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n");
    }
}

struct Service(Child);

impl Service {
    /// SIGTERM and wait: the services flush their spans on the way out.
    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn one_order_and_its_redeliveries_are_one_trace() {
    traced_order("delivery");
}

#[test]
fn with_a_span_per_batch_every_delivery_is_still_in_its_orders_trace() {
    let (api_span, deliveries, spans) = traced_order("batch");
    assert!(
        deliveries.iter().all(|d| d.attrs.contains_key("haunt.outcome") && !d.links.is_empty()),
        "each delivery's span names its outcome and links to its batch's span: {deliveries:?}"
    );
    let dropped = deliveries.iter().filter(|d| d.attrs.get("haunt.ack_dropped").is_some_and(|v| v.contains("true")));
    assert_eq!(dropped.count(), 2, "the two lost acks are marked on their deliveries' spans: {deliveries:?}");
    let batches: Vec<&Seen> = spans
        .iter()
        .filter(|s| s.attrs.contains_key("messaging.batch.message_count") && s.links.contains(&api_span.trace))
        .collect();
    assert!(batches.len() >= 3, "each delivery's batch span links to the order's trace: {batches:?}");
    assert!(
        batches.iter().all(|b| b.trace != api_span.trace),
        "a batch's span is not in the order's trace, it links to it"
    );
}

/// One order through an API and a worker (`--spans form`) whose first two
/// acks are lost: its three deliveries must be in the API span's trace.
/// Returns the API's span, the delivery spans in its trace, and every span
/// received.
fn traced_order(form: &str) -> (Seen, Vec<Seen>, Vec<Seen>) {
    let (otlp_port, spans) = receiver();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("t.db").display());
    let api_port = free_port();
    let endpoint = format!("http://127.0.0.1:{otlp_port}");
    let spawn = |args: &[&str]| {
        Service(
            Command::new(env!("CARGO_BIN_EXE_haunt"))
                .args(args)
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
                .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let api_listen = format!("127.0.0.1:{api_port}");
    let api = spawn(&["api", "--db", &db, "--listen", &api_listen]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", api_port)).is_err() {
        assert!(Instant::now() < deadline, "the API did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let worker =
        spawn(&["worker", "--db", &db, "--ack-fail-next", "2", "--visibility-timeout-ms", "500", "--spans", form]);
    let body = r#"{"order_id":"traced-1","item_id":"a","qty":1}"#;
    let request = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-correlation-id: trace-me\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", api_port)).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    }
    // Two lost acks and 500 ms leases: three deliveries within about 2 s.
    std::thread::sleep(Duration::from_secs(4));
    worker.stop();
    api.stop();

    let spans = spans.lock().unwrap().clone();
    let api_span = spans
        .iter()
        .find(|s| s.name == "orders publish" && s.attrs.values().any(|v| v.contains("trace-me")))
        .unwrap_or_else(|| panic!("no API span for the order among {} spans", spans.len()))
        .clone();
    let deliveries: Vec<Seen> = spans
        .iter()
        .filter(|s| {
            s.name == "orders process" && s.trace == api_span.trace && s.attrs.contains_key("messaging.message.id")
        })
        .cloned()
        .collect();
    assert!(deliveries.len() >= 3, "the API span and {} delivery spans share its trace", deliveries.len());
    assert!(
        deliveries.iter().any(|d| d.attrs.get("haunt.delivery_count").is_some_and(|v| v.contains('3'))),
        "the third delivery is marked by its delivery count: {deliveries:?}"
    );
    (api_span, deliveries, spans)
}
