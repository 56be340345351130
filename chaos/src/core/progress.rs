//! What a run shows while it lasts: the progress line, the harness's own
//! metrics endpoint, and the scrape targets it leaves for Prometheus.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use crate::core::history::Recorder;
use crate::core::nemesis::ActiveFaults;
use crate::core::roles::{Node, Role};
use crate::core::rundir::write_json;

/// A line on stderr, unless the run is quiet.
pub fn say(quiet: bool, line: &str) {
    if !quiet {
        eprintln!("{line}");
    }
}

/// Serves `/metrics` (OpenMetrics) on `addr` until the returned handle drops.
pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<haunt_telemetry::metrics::HarnessMetrics>,
) -> anyhow::Result<AbortOnDrop> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move {
                let body = haunt_telemetry::metrics::encode(&metrics.registry);
                ([(axum::http::header::CONTENT_TYPE, haunt_telemetry::OPENMETRICS_CONTENT_TYPE)], body)
            }
        }),
    );
    Ok(AbortOnDrop(tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })))
}

/// Stops a background task when dropped, on every path out of a run.
#[derive(Debug)]
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The run's metrics endpoints as a Prometheus file_sd file: one target group
/// per node, labelled with the node and the run, so a Prometheus started
/// beforehand finds each run's services by itself.
/// `endpoints`: each node and the base URL of its `/metrics`; `harness`: the
/// harness's own, if it serves one.
pub fn write_scrape_targets(
    path: &Path,
    backend: &str,
    endpoints: &[(Node, String)],
    harness: Option<SocketAddr>,
    run_dir: &Path,
) -> anyhow::Result<()> {
    let run = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let group = |node: &str, url: &str| {
        let target = url.trim_start_matches("http://").trim_end_matches('/');
        serde_json::json!({"targets": [target], "labels": {"node": node, "run": run, "backend": backend}})
    };
    let mut groups: Vec<_> = endpoints.iter().map(|(node, url)| group(&node.name, url)).collect();
    if let Some(addr) = harness {
        groups.push(group("harness", &addr.to_string()));
    }
    // Written aside and renamed: Prometheus never reads half a file.
    let tmp = path.with_extension("tmp");
    write_json(&tmp, &groups)?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Progress while the workload runs: a live bar on a terminal, a plain line
/// every 5 s otherwise (a log file or CI), nothing with `--quiet`. Besides the
/// client ops and the active faults it shows the redeliveries and the
/// duplicates the inbox absorbed so far, scraped from the workers' metrics
/// (`endpoints`: each node and its metrics' base URL); `?` until a worker
/// has answered. The caller leaves it out with `--quiet`.
pub async fn progress(
    recorder: Arc<Recorder>,
    active: Arc<ActiveFaults>,
    endpoints: Vec<(Node, String)>,
    deadline: Instant,
    abort: Arc<AtomicBool>,
) {
    use std::io::IsTerminal;
    let workers: Vec<_> =
        endpoints.into_iter().filter(|(n, _)| n.role == Role::Worker).map(|(n, url)| (n.name, url)).collect();
    // A system without workers' metrics has no delivery figures to show.
    let scraped = !workers.is_empty();
    // Stops scraping when this task is aborted (it is dropped with it).
    let deliveries = crate::core::worker_metrics::Watch::spawn(workers);
    let terminal = std::io::stderr().is_terminal();
    let started = Instant::now();
    let total_s = deadline.saturating_duration_since(started).as_secs().max(1);
    let bar = terminal.then(|| {
        let bar = indicatif::ProgressBar::new(total_s);
        let style = indicatif::ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} s  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar
    });
    let mut last = (started, 0u64);
    // A terminal redraws twice a second; a log gets a line every 5 s, often
    // enough to follow, rare enough to read.
    let mut tick = tokio::time::interval(if terminal { Duration::from_millis(500) } else { Duration::from_secs(5) });
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = Instant::now();
        if abort.load(Ordering::Relaxed) || now >= deadline {
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            if abort.load(Ordering::Relaxed) {
                return;
            }
        }
        let t = recorder.tally();
        let done = t.ok + t.fail + t.info;
        let rate = (done - last.1) as f64 / (now - last.0).as_secs_f64().max(0.001);
        last = (now, done);
        let faults: Vec<String> = active.list().iter().map(|(f, t)| format!("{f} {t}")).collect();
        let faults = if faults.is_empty() { "none".to_owned() } else { faults.join(", ") };
        let delivered = match deliveries.total() {
            Some(c) => format!("  redelivered {}  absorbed {}", c.redeliveries, c.duplicates_absorbed),
            None if scraped => "  redelivered ?  absorbed ?".to_owned(),
            None => String::new(),
        };
        let line =
            format!("{rate:>7.1} ops/s  ok {}  fail {}  info {}{delivered}  faults: {faults}", t.ok, t.fail, t.info);
        match &bar {
            Some(bar) if now < deadline => {
                bar.set_position((now - started).as_secs().min(total_s));
                bar.set_message(line);
            }
            Some(_) => {}
            None => eprintln!(
                "[{:>3}s, {:>3}s left] {line}",
                (now - started).as_secs(),
                deadline.saturating_duration_since(now).as_secs()
            ),
        }
    }
}
