//! `haunt bench`: measurements that are reported, never asserted. Each compares
//! against a baseline measured in the same run on the same machine.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use serde_json::json;

#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// The checker on a synthetic run of N client ops, against merely
    /// deserializing the same files with serde_json.
    Check(CheckBench),
    /// The harness's own ceiling: its clients and history recorder against a
    /// stub API that answers at once, against the same HTTP requests sent
    /// without recording.
    Harness(HarnessBench),
    /// The worker and the API against the database's ceiling, in one run: raw
    /// batched SQL, the per-message design (3 transactions per event), haunt's
    /// workers; API ingest against the raw insert transaction.
    Pipeline(crate::bench_pipeline::PipelineBench),
}

#[derive(Debug, clap::Args)]
pub struct HarnessBench {
    /// Concurrent clients.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Seconds each side runs.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
}

/// A stub of `POST /orders` that commits nothing and answers 201 at once.
async fn stub_api() -> anyhow::Result<std::net::SocketAddr> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let next = std::sync::Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/orders",
        axum::routing::post(move || {
            let n = next.fetch_add(1, Ordering::Relaxed);
            async move { (axum::http::StatusCode::CREATED, axum::Json(json!({"event_id": format!("e{n}")}))) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

pub async fn harness(args: HarnessBench) -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let addr = stub_api().await?;
    let duration = std::time::Duration::from_secs(args.seconds.max(1));

    // Baseline: the same requests, no history.
    let http = reqwest::Client::new();
    let sent = Arc::new(AtomicU64::new(0));
    let deadline = tokio::time::Instant::now() + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..args.concurrency {
        let (http, sent) = (http.clone(), sent.clone());
        let url = format!("http://{addr}/orders");
        tasks.spawn(async move {
            let mut n = 0u64;
            while tokio::time::Instant::now() < deadline {
                n += 1;
                let body = json!({"order_id": format!("b-{t}-{n}"), "item_id": "item-1", "qty": 1});
                if http.post(&url).json(&body).send().await.is_ok_and(|r| r.status().is_success()) {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let baseline = sent.load(Ordering::Relaxed) as f64 / duration.as_secs_f64();

    // The harness: paced clients (pacing far above what can be reached), Jepsen
    // outcomes, every op recorded in a history file.
    let tmp = tempfile::tempdir()?;
    let recorder = Arc::new(haunt_chaos::history::Recorder::create(&tmp.path().join("history.jsonl"))?);
    let client =
        Arc::new(haunt_chaos::workload::HttpClient::new(&format!("http://{addr}"), std::time::Duration::from_secs(2))?);
    let options = haunt_chaos::workload::WorkloadOptions {
        concurrency: args.concurrency,
        rate: 1e9,
        items: 5,
        retries_max: 3,
        seed: 1,
        deadline: tokio::time::Instant::now() + duration,
        metrics: None,
    };
    haunt_chaos::workload::run(client, recorder.clone(), options, Arc::new(AtomicBool::new(false))).await;
    recorder.finish()?;
    let t = recorder.tally();
    let recorded = (t.ok + t.fail + t.info) as f64 / duration.as_secs_f64();
    let report = json!({
        "bench": "harness",
        "machine": machine(),
        "concurrency": args.concurrency,
        "seconds": duration.as_secs(),
        "baseline_requests_per_s": baseline,
        "harness_ops_per_s": recorded,
        "harness_over_baseline": recorded / baseline,
        "history_lines": recorder.ops(),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct CheckBench {
    /// Client ops in the synthetic history.
    #[arg(long, default_value_t = 1_000_000)]
    pub ops: u64,
    /// Where to write the synthetic run (default: a temporary directory, removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Concurrent client processes simulated in the history.
    #[arg(long, default_value_t = 64)]
    pub clients: u64,
}

/// Peak resident memory of this process so far, in MiB (Linux).
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("{cpu}, {cores} cores")
}

/// Reads every line of `path` into a `serde_json::Value` and drops it: the cost
/// of merely deserializing the file.
fn deserialize_only(path: &Path) -> anyhow::Result<u64> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut line = Vec::with_capacity(512);
    let mut n = 0;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(n);
        }
        let value: serde_json::Value = serde_json::from_slice(&line)?;
        std::hint::black_box(&value);
        n += 1;
    }
}

pub fn check(args: CheckBench) -> anyhow::Result<()> {
    let tmp;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_owned()
        }
    };
    eprintln!("writing a synthetic run of {} client ops to {}", args.ops, dir.display());
    let t = Instant::now();
    let written = haunt_chaos::synthetic::write_run(&dir, args.ops, args.clients, 1)?;
    let generate_s = t.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(dir.join(haunt_format::HISTORY_FILE))?.len()
        + std::fs::metadata(dir.join(haunt_format::FINAL_STATE_FILE))?.len();

    let t = Instant::now();
    let lines = deserialize_only(&dir.join(haunt_format::HISTORY_FILE))?
        + deserialize_only(&dir.join(haunt_format::FINAL_STATE_FILE))?;
    let deserialize_s = t.elapsed().as_secs_f64();
    let rss_after_deserialize = peak_rss_mib();

    let t = Instant::now();
    let results = haunt_checker::check_dir(&dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let check_s = t.elapsed().as_secs_f64();
    let rss_after_check = peak_rss_mib();

    let report = json!({
        "bench": "check",
        "machine": machine(),
        "ops": written.ops,
        "orders": written.orders,
        "lines": lines,
        "bytes": bytes,
        "generate_s": generate_s,
        "deserialize_only_s": deserialize_s,
        "check_s": check_s,
        "check_over_deserialize": check_s / deserialize_s,
        "peak_rss_mib_after_deserialize": rss_after_deserialize,
        "peak_rss_mib_after_check": rss_after_check,
        "verdict": results.valid.as_str(),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    anyhow::ensure!(results.valid == haunt_checker::Verdict::Valid, "the synthetic run must check valid");
    Ok(())
}
