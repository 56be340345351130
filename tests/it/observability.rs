//! The observability contract against real components: a Prometheus (Debian's
//! `prometheus`, started here on 127.0.0.1) scrapes a short run's services and
//! harness, and every PromQL expression of the Grafana dashboards must return
//! series; exemplars carry correlation ids; the dashboards are well-formed and
//! name only metrics that are exported; promtool and docker-compose accept the
//! configuration.
//!
//! Needs `prometheus` and `promtool` on PATH (`scripts/test` installs them on
//! Debian as root); `HAUNT_SKIP_PROMETHEUS=1` skips, and says so.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::run::{haunt_run, latest, read_json};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dashboards() -> Vec<(String, Value)> {
    let dir = repo().join("grafana/dashboards");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), read_json(&e.path())))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 2, "pipeline.json and chaos.json");
    out
}

/// `(dashboard, panel title, expr)` of every query, annotations included.
fn expressions() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (file, d) in dashboards() {
        for panel in d["panels"].as_array().unwrap() {
            for t in panel["targets"].as_array().unwrap() {
                let title = panel["title"].as_str().unwrap().to_owned();
                out.push((file.clone(), title, t["expr"].as_str().unwrap().to_owned()));
            }
        }
        for a in d["annotations"]["list"].as_array().unwrap() {
            if let Some(expr) = a["expr"].as_str() {
                out.push((file.clone(), format!("annotation {}", a["name"]), expr.to_owned()));
            }
        }
    }
    out
}

/// Metric names in an expression (`haunt_…`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("haunt_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        names.push(expr[start..end].to_owned());
        i = end;
    }
    names
}

/// Every sample name the services and the harness export (`_total`, `_bucket`,
/// … included), read from their own registries. A labelled family shows up only
/// once it has a member, so each gets one.
fn exported_names() -> HashSet<String> {
    use haunt_telemetry::metrics::*;
    let api = ApiMetrics::default();
    api.orders.get_or_create(&OutcomeLabels { outcome: "created" }).inc();
    drop(api.http_request_duration.get_or_create(&HttpLabels { method: "POST".into(), route: "/orders", status: 201 }));
    let worker = WorkerMetrics::default();
    drop(worker.deliveries.get_or_create(&OutcomeLabels { outcome: "applied" }));
    drop(worker.queue_messages.get_or_create(&QueueLabels { state: "visible" }));
    let harness = HarnessMetrics::default();
    drop(harness.fault_active.get_or_create(&FaultLabels { fault: "kill".into(), target: "api".into() }));
    drop(harness.client_ops.get_or_create(&ClientOpLabels { r#type: "ok" }));
    drop(harness.client_op_duration.get_or_create(&ClientOpLabels { r#type: "ok" }));
    drop(harness.check_anomalies.get_or_create(&AnomalyLabels { anomaly: "lost-order".into() }));
    let texts = [encode(&api.registry), encode(&worker.registry), encode(&harness.registry)];
    let mut names = HashSet::new();
    for text in texts {
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        }
    }
    names
}

/// The `uid`s of the provisioned data sources.
fn provisioned_uids() -> HashSet<String> {
    let text = std::fs::read_to_string(repo().join("grafana/provisioning/datasources/datasources.yaml")).unwrap();
    text.lines().filter_map(|l| l.trim().strip_prefix("uid: ")).map(|u| u.trim().to_owned()).collect()
}

fn datasource_uids(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(uid) = map.get("datasource").and_then(|d| d.get("uid")).and_then(Value::as_str) {
                out.push(uid.to_owned());
            }
            map.values().for_each(|v| datasource_uids(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| datasource_uids(v, out)),
        _ => {}
    }
}

#[test]
fn dashboards_are_valid_grafana_json_over_exported_metrics() {
    let uids = provisioned_uids();
    assert!(uids.contains("prometheus") && uids.contains("jaeger"), "{uids:?}");
    let exported = exported_names();
    for (file, d) in dashboards() {
        assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 30), "{file}: schemaVersion");
        assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()), "{file}: uid");
        let panels = d["panels"].as_array().unwrap();
        let ids: Vec<u64> = panels.iter().map(|p| p["id"].as_u64().expect("a numeric panel id")).collect();
        assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), ids.len(), "{file}: panel ids are unique: {ids:?}");
        for p in panels {
            assert!(p["gridPos"]["w"].as_u64().is_some() && p["type"].is_string(), "{file}: {}", p["title"]);
            assert!(!p["targets"].as_array().unwrap().is_empty(), "{file}: {} has a query", p["title"]);
        }
        let mut used = Vec::new();
        datasource_uids(&d, &mut used);
        for uid in used {
            assert!(uid == "-- Grafana --" || uids.contains(&uid), "{file}: data source {uid} is not provisioned");
        }
    }
    for (file, title, expr) in expressions() {
        for name in metric_names(&expr) {
            assert!(exported.contains(&name), "{file} / {title}: {name} is not exported by any service or the harness");
        }
    }
}

fn tool(name: &str) -> Option<PathBuf> {
    if std::env::var("HAUNT_SKIP_PROMETHEUS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: the Prometheus tests (HAUNT_SKIP_PROMETHEUS=1)");
        return None;
    }
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    Some(found.unwrap_or_else(|| {
        panic!("{name} is missing: run ./scripts/test (installs Debian's prometheus), or set HAUNT_SKIP_PROMETHEUS=1")
    }))
}

#[test]
fn promtool_accepts_the_prometheus_configuration() {
    let Some(promtool) = tool("promtool") else { return };
    let out = Command::new(promtool)
        .args(["check", "config", "--syntax-only"])
        .arg(repo().join("prometheus/prometheus.yml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn docker_compose_accepts_the_stack_and_the_local_override() {
    if std::env::var("HAUNT_SKIP_DOCKER").as_deref() == Ok("1") {
        eprintln!("SKIPPED: docker-compose config (HAUNT_SKIP_DOCKER=1)");
        return;
    }
    for files in [vec!["compose.yaml"], vec!["compose.yaml", "compose.local.yaml"]] {
        let mut c = Command::new("docker-compose");
        c.current_dir(repo());
        for f in &files {
            c.args(["-f", f]);
        }
        let out = c.args(["config", "--quiet"]).output().expect("docker-compose (scripts/docker installs it)");
        assert!(out.status.success(), "{files:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// A Prometheus of the test's own, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start_prometheus(bin: &Path, dir: &Path, sd: &Path) -> Prometheus {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: haunt-runs\n    file_sd_configs:\n      \
             - files: [\"{}\"]\n        refresh_interval: 1s\n",
            sd.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--enable-feature=exemplar-storage")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .unwrap();
    let prometheus = Prometheus { child, url: format!("http://127.0.0.1:{port}") };
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&format!("{}/-/ready", prometheus.url)).is_none() {
        assert!(
            Instant::now() < deadline,
            "Prometheus did not get ready; see {}",
            dir.join("prometheus.log").display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    prometheus
}

/// A blocking GET on a throwaway runtime (the test itself is synchronous).
fn get(url: &str) -> Option<Value> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().ok()?;
        let r = http.get(url).send().await.ok()?;
        if !r.status().is_success() {
            return None;
        }
        r.json::<Value>().await.ok().or(Some(Value::Null))
    })
}

fn query(prom: &str, expr: &str, at_s: f64) -> Vec<Value> {
    let mut url = reqwest::Url::parse(&format!("{prom}/api/v1/query")).unwrap();
    url.query_pairs_mut().append_pair("query", expr).append_pair("time", &format!("{at_s:.3}"));
    let body = get(url.as_str()).unwrap_or_else(|| panic!("Prometheus refused {expr}"));
    body["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

#[test]
fn every_dashboard_query_returns_series_from_a_real_prometheus_scraping_a_run() {
    let Some(bin) = tool("prometheus") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let sd = tmp.path().join("targets.json");
    std::fs::write(&sd, "[]\n").unwrap();
    let prometheus = start_prometheus(&bin, tmp.path(), &sd);

    let harness_port = free_port().to_string();
    let time_limit_s = 15.0;
    let out = haunt_run(
        &tmp.path().join("store"),
        &[
            "--time-limit-s",
            "15",
            "--nemesis",
            "ack-loss,kill",
            "--nemesis-interval-s",
            "2",
            "--seed",
            "21",
            "--metrics-listen",
            &format!("127.0.0.1:{harness_port}"),
            "--metrics-linger-s",
            "5",
            "--prometheus-sd",
            sd.to_str().unwrap(),
            "--quiet",
        ],
    )
    .output()
    .unwrap();
    // The harness lingered 5 s after the check; 2 s before it exited it still served.
    let checked_at = now_s() - 2.0;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let run = read_json(&latest(&tmp.path().join("store")).join("run.json"));
    let started = run["started_at_ms"].as_f64().unwrap() / 1000.0;
    // The end of the workload: every service still up, faults done or ending.
    let workload_end = started + time_limit_s - 0.5;

    let mut empty = Vec::new();
    for (file, title, expr) in expressions() {
        let mut expr = expr.replace("$__rate_interval", "10s");
        if title.starts_with("annotation") {
            // An annotation marks windows: some instant of the run must be in one.
            expr = format!("max_over_time(({expr})[{time_limit_s}s:1s])");
        }
        let found = [workload_end, checked_at].iter().any(|at| !query(&prometheus.url, &expr, *at).is_empty());
        if !found {
            empty.push(format!("{file} / {title}: {expr}"));
        }
    }
    assert!(empty.is_empty(), "queries without a series:\n{}", empty.join("\n"));

    // Exemplars of the delivery-attempt histogram, with the order's correlation id.
    let mut url = reqwest::Url::parse(&format!("{}/api/v1/query_exemplars", prometheus.url)).unwrap();
    url.query_pairs_mut()
        .append_pair("query", "haunt_delivery_attempt_bucket")
        .append_pair("start", &format!("{started:.3}"))
        .append_pair("end", &format!("{:.3}", now_s()));
    let body = get(url.as_str()).expect("the exemplar API answers");
    let series = body["data"].as_array().cloned().unwrap_or_default();
    let exemplars: Vec<&Value> = series.iter().flat_map(|s| s["exemplars"].as_array().unwrap().iter()).collect();
    assert!(!exemplars.is_empty(), "exemplars of haunt_delivery_attempt are stored: {body}");
    assert!(
        exemplars.iter().all(|e| e["labels"]["correlation_id"].as_str().is_some_and(|c| c.starts_with("o-"))),
        "each exemplar names its order: {:?}",
        exemplars.first()
    );
    // And its order's trace, though the run exports no spans: the worker
    // reads it from the message's traceparent.
    let is_trace_id =
        |t: &str| t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()) && t.bytes().any(|b| b != b'0');
    assert!(
        exemplars.iter().all(|e| e["labels"]["trace_id"].as_str().is_some_and(is_trace_id)),
        "each exemplar carries its order's trace id: {:?}",
        exemplars.iter().find(|e| !e["labels"]["trace_id"].as_str().is_some_and(is_trace_id))
    );
}
