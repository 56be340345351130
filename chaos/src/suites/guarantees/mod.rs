//! `haunt guarantees`: the tutorial's table of delivery guarantees, measured.
//!
//! For each transport and mode (the database queue among them), and for each
//! inbox setting (the correct build, and `--bug no-inbox`):
//!
//! 1. seed after seed, one `haunt run` under the same seeded fault schedule:
//!    a consumer kill, a broker restart (where the broker's server is
//!    durable), a consumer<->broker partition (consumer<->database for the
//!    database queue), ack loss, and with a broker a kill of the relay
//!    (`relay-kill`). The
//!    faults target `worker-1`, its link and the relay, so each seed hits the
//!    same places on every transport;
//! 2. after each such run, with the inbox, `haunt reconcile` on its database:
//!    the lost effects it re-enqueued and the projection rows it corrected; a
//!    worker then drains what it re-enqueued, and the checker judges the
//!    repaired state again (`after-reconcile/` in the run directory);
//! 3. one fault-free run at a rate above what the pipeline absorbs: events/s
//!    from the first order to the last application, and the p99 effect lag;
//! 4. with `--speed-db`, over a broker: `haunt bench transport`, haunt's
//!    relay and workers against the transport's own client without the
//!    database ([`TransportSpeed`]): the row's speed is the lower of the
//!    two ratios, and the bare client's rate in the row's mode against its
//!    rate in the broker's first mode is the tutorial's "fast, normal,
//!    slow", measured.
//!
//! Each row then says whether what was measured matches what the transport
//! claims ([`Guarantee`]): at-most-once may lose and must not deliver twice;
//! at-least-once must not lose; exactly-once must neither lose nor apply
//! twice. Each run is a child `haunt run`, as in `haunt matrix`.

mod judge;
pub mod page;
mod table;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use haunt_checker::Results;
use haunt_format::FinalLine;
use haunt_store::{Store, StoreOptions};
use haunt_transport::TransportSpec;
use serde::Serialize;

use crate::core::fault::Fault;
use crate::core::options::{KafkaServer, RunOptions};
use crate::suites::matrix::child_run;
use judge::{judge, judge_order};
pub use table::table;
use table::write_outputs;

/// What `haunt guarantees` runs.
#[derive(Debug, Clone)]
pub struct GuaranteesOptions {
    /// The `haunt` executable each run is a child of.
    pub haunt: PathBuf,
    pub store: PathBuf,
    pub transports: Vec<TransportSpec>,
    /// Fault runs per row, seeds 1..=N.
    pub seeds: u64,
    /// Each fault run's workload, in seconds.
    pub time_limit_s: u64,
    /// The fault-free run's workload, in seconds.
    pub throughput_time_limit_s: u64,
    /// An empty PostgreSQL database for `haunt bench transport`, row after
    /// row; `None` leaves the speed columns out.
    pub speed_db: Option<haunt_store::DbUrl>,
    /// Events of each of the transport bench's phases; `None` for the
    /// bench's default for each transport.
    pub speed_events: Option<usize>,
    /// The server behind the Kafka rows: Apache Kafka's broker, or tansu.
    pub kafka_server: KafkaServer,
}

/// The visibility timeout of every run: short, so that a run of a few
/// seconds sees redeliveries (the same for every transport).
const VISIBILITY_TIMEOUT: Duration = Duration::from_secs(1);

/// The fault-free run's offered load: more than any transport here absorbs on
/// 2 cores, so that events/s is the pipeline's and not the workload's.
const THROUGHPUT_RATE: f64 = 3000.0;
const THROUGHPUT_CONCURRENCY: usize = 32;

/// Keys of the fault runs whose orders are fixed in real time (each one
/// client's, in turn), for the order column: half the default clients'.
const ORDERED_KEYS: usize = 4;

/// How long a run may take to drain after its workload: a fault-free run at
/// [`THROUGHPUT_RATE`] leaves a backlog that takes a slow transport a while.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a row's `haunt bench transport` may take (it is killed after).
const SPEED_LIMIT: Duration = Duration::from_secs(1800);

/// How long the worker that drains what reconcile re-enqueued may take.
const REPAIR_DRAIN_MAX: Duration = Duration::from_secs(60);

/// One fault run of a row.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRun {
    pub seed: u64,
    pub run_dir: Option<String>,
    /// The checker's verdict: `true`, `false` or `unknown`.
    pub verdict: Option<String>,
    pub acknowledged: u64,
    /// `lost-effect`: acknowledged orders whose event was never applied, after
    /// the run drained and before any reconciliation.
    pub lost: u64,
    /// Events the consumers received more than once; `None` without an inbox,
    /// which is what records deliveries.
    pub delivered_more_than_once: Option<u64>,
    pub redeliveries: Option<u64>,
    /// Events applied more than once (from the ledger of applications).
    pub applied_more_than_once: u64,
    /// Messages the broker still held but could only count.
    pub unlisted: u64,
    /// Pairs of one key's orders whose order was fixed in real time, and the
    /// orders overtaken among them (the checker's `order` section; 0 when
    /// it has none).
    pub order_pairs: u64,
    pub overtaken: u64,
    pub faults_fired: serde_json::Value,
    pub repair: Option<Repair>,
    pub error: Option<String>,
}

/// What `haunt reconcile` did after a run, and the check of what it left.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Repair {
    /// Orders whose event was nowhere, enqueued again.
    pub requeued: u64,
    /// Items whose projection it set back to the sum of their applied orders.
    pub projection_corrected: u64,
    /// After a worker drained what it re-enqueued: the checker again.
    pub lost_after: u64,
    pub projection_mismatch_after: u64,
    pub applied_more_than_once_after: u64,
    pub verdict_after: String,
}

/// The fault-free run of a row.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub run_dir: Option<String>,
    pub events_per_s: Option<f64>,
    pub effect_lag_ms_p99: Option<f64>,
    pub error: Option<String>,
}

/// What `haunt bench transport` measured for a row: haunt's relay and
/// workers, each against the transport's own client doing the same without
/// the database, paired (medians of the rounds).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TransportSpeed {
    /// Its JSON report.
    pub report: Option<String>,
    /// The relay's publish rate over the bare client's.
    pub relay_vs_bare: Option<f64>,
    /// The workers' drain rate (inbox or not, as the row) over the bare
    /// client's.
    pub workers_vs_bare: Option<f64>,
    pub bare_publish_events_per_s: Option<f64>,
    pub bare_drain_events_per_s: Option<f64>,
    /// The bare client's events over the time to publish and drain them:
    /// the mode's own rate, end to end.
    pub bare_events_per_s: Option<f64>,
    pub error: Option<String>,
}

/// One transport, mode and inbox setting.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// As `--transport` spells it.
    pub transport: String,
    /// The broker's nodes: 3 for a Kafka cluster (`×3` in the table), else 1.
    pub brokers: usize,
    /// The server, where it is not the transport's own: `tansu` behind
    /// Kafka's transport (`on tansu` in the table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<&'static str>,
    pub inbox: bool,
    /// What the transport claims.
    pub claim: &'static str,
    /// Sums over the fault runs that finished.
    pub lost: u64,
    pub delivered_more_than_once: Option<u64>,
    pub applied_more_than_once: u64,
    pub events_per_s: Option<f64>,
    /// The transport's own speed: the lower of haunt's relay and workers
    /// each over the transport's bare client ([`TransportSpeed`]); `None`
    /// where not measured (no `--speed-db`, or the database queue).
    pub speed: Option<f64>,
    /// The bare client's rate in this row's mode over its rate in the
    /// broker's first mode (its at-least-once one), as measured in this
    /// table: above 1 faster, below 1 slower.
    pub mode_speed: Option<f64>,
    pub transport_speed: Option<TransportSpeed>,
    pub effect_lag_ms_p99: Option<f64>,
    /// Summed over the runs; `None` without an inbox, where reconcile cannot
    /// tell an applied order from a lost one (it reads the inbox).
    pub repaired_by_reconcile: Option<Repair>,
    /// What the transport claims about a key's order: `none` or `per-key`.
    pub order_claim: &'static str,
    /// Summed over the fault runs that finished: pairs of one key's orders
    /// fixed in real time, and orders overtaken.
    pub order_pairs: u64,
    pub overtaken: u64,
    /// `None` when no fault run finished.
    pub matches_claim: Option<bool>,
    /// What the row shows that is worth saying: a contradiction of the claim,
    /// or an allowance the faults never used.
    pub finding: Option<String>,
    pub runs: Vec<FaultRun>,
    pub throughput: Throughput,
}

/// Kafka's nodes for a row: three where the mode's claim turns on what a
/// cluster does when a partition's leader fails (`acks=all` with
/// `min.insync.replicas` 2 against `acks=1`), one elsewhere.
/// tansu runs one node.
fn kafka_brokers(server: KafkaServer, spec: TransportSpec) -> usize {
    let cluster = spec.kind == haunt_transport::Kind::Kafka && matches!(spec.mode(), "at-least-once" | "acks-1");
    if cluster && server == KafkaServer::Kafka { 3 } else { 1 }
}

/// Whether `spec` runs on tansu in a table over `server`.
fn on_tansu(server: KafkaServer, spec: TransportSpec) -> bool {
    server == KafkaServer::Tansu && spec.kind == haunt_transport::Kind::Kafka
}

/// The faults of a transport's fault runs, and their targets. On a Kafka
/// cluster a partition may also isolate a node from its peers and its
/// clients (a leader's failover), any node or the leader of partition 0 as
/// the cut comes, and a broker-restart takes any node.
/// tansu's clients share one link (`clients<->broker`).
fn fault_schedule(server: KafkaServer, spec: TransportSpec) -> (Vec<Fault>, Vec<String>) {
    let (mut faults, mut targets) = (vec![Fault::Kill, Fault::Partition, Fault::AckLoss], vec!["worker-1"]);
    if kafka_brokers(server, spec) > 1 {
        targets.extend(["broker-1<->all", "broker-2<->all", "broker-3<->all", "leader<->all"]);
    }
    if on_tansu(server, spec) {
        targets.extend(["clients<->broker", "relay"]);
        faults.insert(1, Fault::BrokerRestart);
        faults.push(Fault::RelayKill);
    } else if spec.is_broker() {
        targets.extend(["worker-1<->broker", "relay"]);
        if spec.server_is_durable() {
            faults.insert(1, Fault::BrokerRestart);
        }
        faults.push(Fault::RelayKill);
    } else {
        targets.push("worker-1<->db");
    }
    (faults, targets.into_iter().map(str::to_owned).collect())
}

/// The options every run of a row shares: `haunt run`'s defaults, over
/// `spec`, with or without the inbox.
fn row_options(options: &GuaranteesOptions, runs_dir: &Path, spec: TransportSpec, inbox: bool) -> RunOptions {
    RunOptions {
        store: runs_dir.to_owned(),
        transport: spec,
        quiet: true,
        quiesce_timeout: QUIESCE_TIMEOUT,
        bug: (!inbox).then_some(haunt_store::Bug::NoInbox),
        exe: options.haunt.clone(),
        kafka_brokers: kafka_brokers(options.kafka_server, spec),
        kafka_server: if on_tansu(options.kafka_server, spec) { KafkaServer::Tansu } else { KafkaServer::Kafka },
        ..RunOptions::default()
    }
}

async fn fault_run(
    options: &GuaranteesOptions,
    runs_dir: &Path,
    spec: TransportSpec,
    inbox: bool,
    seed: u64,
) -> FaultRun {
    let (faults, fault_targets) = fault_schedule(options.kafka_server, spec);
    let run_options = RunOptions {
        seed,
        time_limit: Duration::from_secs(options.time_limit_s),
        // About six faults a run, as in `haunt matrix`.
        nemesis_interval: Duration::from_secs_f64((options.time_limit_s as f64 / 6.0).clamp(1.0, 5.0)),
        faults,
        fault_targets,
        visibility_timeout: VISIBILITY_TIMEOUT,
        fit_check: false,
        ordered_keys: ORDERED_KEYS,
        ..row_options(options, runs_dir, spec, inbox)
    };
    let mut run = FaultRun {
        seed,
        run_dir: None,
        verdict: None,
        acknowledged: 0,
        lost: 0,
        delivered_more_than_once: None,
        redeliveries: None,
        applied_more_than_once: 0,
        unlisted: 0,
        order_pairs: 0,
        overtaken: 0,
        faults_fired: serde_json::Value::Null,
        repair: None,
        error: None,
    };
    let (dir, results) = match child_run(&options.haunt, &run_options, &format!("fault-{spec}-{inbox}-{seed}")).await {
        Ok(done) => done,
        Err(e) => {
            run.error = Some(e);
            return run;
        }
    };
    let run_file = read_json(&dir.join("run.json")).unwrap_or_default();
    run.run_dir = Some(dir.display().to_string());
    run.verdict = Some(results.valid.as_str().to_owned());
    run.acknowledged = results.counts.acknowledged;
    run.lost = anomaly_count(&results, "lost-effect");
    run.delivered_more_than_once = delivered_more_than_once(&dir);
    run.redeliveries = results.delivery.redeliveries;
    run.applied_more_than_once = results.delivery.applied_more_than_once;
    run.unlisted = unlisted(&dir);
    if let Some(order) = &results.order {
        (run.order_pairs, run.overtaken) = (order.pairs_checked, order.inversions);
    }
    run.faults_fired = run_file.get("faults_fired").cloned().unwrap_or_default();
    if results.valid == haunt_checker::Verdict::Unknown {
        // Its counts are not a measurement: what did not drain may yet arrive.
        run.error = Some(format!("verdict unknown: {}", results.unknown_reasons.join("; ")));
        return run;
    }
    if inbox {
        match repair(&options.haunt, &dir).await {
            Ok(repair) => run.repair = Some(repair),
            Err(e) => run.error = Some(format!("reconciling: {e:#}")),
        }
    }
    run
}

async fn throughput_run(options: &GuaranteesOptions, runs_dir: &Path, spec: TransportSpec, inbox: bool) -> Throughput {
    let run_options = RunOptions {
        seed: 1,
        time_limit: Duration::from_secs(options.throughput_time_limit_s),
        faults: Vec::new(),
        rate: THROUGHPUT_RATE,
        concurrency: THROUGHPUT_CONCURRENCY,
        ..row_options(options, runs_dir, spec, inbox)
    };
    match child_run(&options.haunt, &run_options, &format!("throughput-{spec}-{inbox}")).await {
        Ok((dir, results)) => Throughput {
            run_dir: Some(dir.display().to_string()),
            events_per_s: events_per_s(&results),
            effect_lag_ms_p99: (results.latency_ms.effect_lag.count > 0).then_some(results.latency_ms.effect_lag.p99),
            error: None,
        },
        Err(e) => Throughput { run_dir: None, events_per_s: None, effect_lag_ms_p99: None, error: Some(e) },
    }
}

fn anomaly_count(results: &Results, name: &str) -> u64 {
    results.anomalies.get(name).map_or(0, |a| a.count)
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// The final state's lines, the unreadable left out (the checker has judged
/// the same file already).
fn final_lines(run_dir: &Path) -> Vec<FinalLine> {
    let text = std::fs::read_to_string(run_dir.join(haunt_format::FINAL_STATE_FILE)).unwrap_or_default();
    text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

/// Events that reached a consumer more than once: delivered again (a
/// redelivery) or refused by the inbox as a duplicate (a fan-out, a second
/// publish). `None` when no order line carries its deliveries, as without
/// an inbox, which is what records them.
fn delivered_more_than_once(run_dir: &Path) -> Option<u64> {
    let mut known = false;
    let mut twice = 0;
    for line in final_lines(run_dir) {
        if let FinalLine::Order(o) = line {
            known |= o.deliveries.is_some();
            twice += u64::from(o.deliveries.unwrap_or(0) > 1 || o.duplicates_absorbed.unwrap_or(0) > 0);
        }
    }
    known.then_some(twice)
}

/// The `meta` line's `unlisted`: what a broker held at the read and could only count.
fn unlisted(run_dir: &Path) -> u64 {
    meta(run_dir).and_then(|m| m.unlisted).unwrap_or(0)
}

fn meta(run_dir: &Path) -> Option<haunt_format::Meta> {
    final_lines(run_dir).into_iter().rev().find_map(|line| match line {
        FinalLine::Meta(meta) => Some(meta),
        _ => None,
    })
}

/// Events applied (each once, however often it was applied) from time 0 of
/// the history to the end of the bucket of the last application: the
/// pipeline's rate end to end, with the drain after the workload included.
pub fn events_per_s(results: &Results) -> Option<f64> {
    let last = results.series.applications.as_ref()?.last()?;
    let span_s = (last.start_ns + results.series.bucket_ns) as f64 / 1e9;
    (span_s > 0.0).then(|| results.counts.applied_events as f64 / span_s)
}

/// `haunt reconcile` on the run's database, a worker to drain what it
/// re-enqueued, and the checker on the repaired state: the run's history
/// with a final state read afresh, in `after-reconcile/`.
pub async fn repair(haunt: &Path, run_dir: &Path) -> anyhow::Result<Repair> {
    let url = haunt_store::DbUrl::sqlite_file(&run_dir.join("haunt.db"));
    let store = Store::connect(&url, StoreOptions::default()).await.context("opening the run's database")?;
    let report = store.reconcile(false).await.context("reconcile")?;
    let mut repair = Repair {
        requeued: report.requeued.len() as u64,
        projection_corrected: report.drift.len() as u64,
        ..Repair::default()
    };
    let drained = if report.requeued.is_empty() { Ok(()) } else { drain(haunt, &url, &store).await };
    let after = run_dir.join("after-reconcile");
    std::fs::create_dir_all(&after)?;
    std::fs::copy(run_dir.join(haunt_format::HISTORY_FILE), after.join(haunt_format::HISTORY_FILE))?;
    let mut lines = store.final_state_lines().await?;
    store.close().await;
    drained?;
    let mut meta = meta(run_dir).context("the run's final state has no meta line")?;
    // What the broker held is abandoned with it: reconcile re-enqueued it.
    (meta.quiesced, meta.unlisted) = (true, None);
    lines.push(FinalLine::Meta(meta));
    let mut text = String::new();
    for line in &lines {
        text.push_str(&serde_json::to_string(line)?);
        text.push('\n');
    }
    std::fs::write(after.join(haunt_format::FINAL_STATE_FILE), text)?;
    let results = haunt_checker::check_dir(&after).map_err(|e| anyhow::anyhow!("checking the repaired state: {e}"))?;
    std::fs::write(after.join(haunt_format::RESULTS_FILE), serde_json::to_string_pretty(&results)? + "\n")?;
    repair.lost_after = anomaly_count(&results, "lost-effect");
    repair.projection_mismatch_after = anomaly_count(&results, "projection-mismatch");
    repair.applied_more_than_once_after = results.delivery.applied_more_than_once;
    repair.verdict_after = results.valid.as_str().to_owned();
    Ok(repair)
}

/// A `haunt worker` on the database queue until the queue is empty.
async fn drain(haunt: &Path, url: &haunt_store::DbUrl, store: &Store) -> anyhow::Result<()> {
    let mut command = tokio::process::Command::new(haunt);
    command
        .args(["worker", "--db", url.as_str(), "--worker-id", "reconcile-drain"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    // Stopped with this process, however it ends.
    crate::backends::local::interrupt_when_parent_dies(command.as_std_mut());
    let mut worker = command.spawn().context("starting a worker to drain what reconcile re-enqueued")?;
    let deadline = tokio::time::Instant::now() + REPAIR_DRAIN_MAX;
    let result = loop {
        let s = store.queue_stats().await?;
        if s.visible + s.leased + s.delayed == 0 {
            break Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            break Err(anyhow::anyhow!("what reconcile re-enqueued did not drain within {REPAIR_DRAIN_MAX:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = worker.kill().await;
    result
}

impl Row {
    fn new(spec: TransportSpec, inbox: bool, runs: Vec<FaultRun>, throughput: Throughput) -> Row {
        let done: Vec<&FaultRun> = runs.iter().filter(|r| r.error.is_none()).collect();
        let lost = done.iter().map(|r| r.lost).sum();
        let applied_more_than_once = done.iter().map(|r| r.applied_more_than_once).sum();
        let delivered_more_than_once =
            done.iter().map(|r| r.delivered_more_than_once).sum::<Option<u64>>().filter(|_| !done.is_empty());
        let repaired_by_reconcile = (inbox && !done.is_empty()).then(|| {
            let mut sum = Repair { verdict_after: "true".into(), ..Repair::default() };
            for r in done.iter().filter_map(|r| r.repair.as_ref()) {
                sum.requeued += r.requeued;
                sum.projection_corrected += r.projection_corrected;
                sum.lost_after += r.lost_after;
                sum.projection_mismatch_after += r.projection_mismatch_after;
                sum.applied_more_than_once_after += r.applied_more_than_once_after;
                if r.verdict_after != "true" {
                    sum.verdict_after = r.verdict_after.clone();
                }
            }
            sum
        });
        let claim = spec.claim();
        let order_claim = spec.order_claim();
        let order_pairs = done.iter().map(|r| r.order_pairs).sum();
        let overtaken = done.iter().map(|r| r.overtaken).sum();
        let (matches_claim, finding) = if done.is_empty() {
            (None, None)
        } else {
            let (no_promise, twice) = (spec.no_promise_under(), delivered_more_than_once);
            let delivery = judge(claim, no_promise, lost, twice, applied_more_than_once, &done);
            judge_order(order_claim, order_pairs, overtaken, &done, delivery)
        };
        Row {
            transport: spec.to_string(),
            brokers: kafka_brokers(KafkaServer::Kafka, spec),
            server: None,
            inbox,
            claim: claim.name(),
            lost,
            delivered_more_than_once,
            applied_more_than_once,
            events_per_s: throughput.events_per_s,
            speed: None,
            mode_speed: None,
            transport_speed: None,
            effect_lag_ms_p99: throughput.effect_lag_ms_p99,
            repaired_by_reconcile,
            order_claim: order_claim.name(),
            order_pairs,
            overtaken,
            matches_claim,
            finding,
            runs,
            throughput,
        }
    }
}

/// Fills each row's speed (the lower of its transport bench's two ratios)
/// and its mode's speed: the mode's bare rate over the bare rate of its
/// broker's first mode, each the mean over the rows of that mode (the rows
/// with and without the inbox measure the same bare client), where that
/// mode has one.
fn set_speeds(rows: &mut [Row]) {
    let bare = |r: &Row| r.transport_speed.as_ref().and_then(|s| s.bare_events_per_s);
    let measured: Vec<(TransportSpec, f64)> =
        rows.iter().filter_map(|r| Some((r.transport.parse::<TransportSpec>().ok()?, bare(r)?))).collect();
    let mode_rate = |spec: TransportSpec| {
        let rates: Vec<f64> = measured.iter().filter(|(s, _)| *s == spec).map(|(_, r)| *r).collect();
        (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64)
    };
    for row in rows.iter_mut() {
        row.speed = row.transport_speed.as_ref().and_then(|s| match (s.relay_vs_bare, s.workers_vs_bare) {
            (Some(a), Some(b)) => Some(a.min(b)),
            _ => None,
        });
        row.mode_speed = row.transport.parse::<TransportSpec>().ok().and_then(|spec| {
            let (rate, base) = (mode_rate(spec)?, mode_rate(first_mode(spec))?);
            (base > 0.0).then(|| rate / base)
        });
    }
}

/// The first mode on the transport's broker server: its at-least-once mode
/// (Redis Pub/Sub's is Redis Streams', on the same `redis-server`).
fn first_mode(spec: TransportSpec) -> TransportSpec {
    TransportSpec::all().into_iter().find(|s| s.server() == spec.server()).unwrap_or(spec)
}

/// `haunt bench transport` for a row, a child of this executable, when
/// `--speed-db` names a database and the row has a broker.
async fn speed_run(
    options: &GuaranteesOptions,
    runs_dir: &Path,
    spec: TransportSpec,
    inbox: bool,
) -> Option<TransportSpeed> {
    let db = options.speed_db.as_ref()?;
    if !spec.is_broker() {
        return None;
    }
    let name = format!("speed-{}-{}", spec.to_string().replace(':', "-"), if inbox { "inbox" } else { "no-inbox" });
    let report = runs_dir.join(format!("{name}.json"));
    let log = runs_dir.join(format!("{name}.log"));
    let mut speed = TransportSpeed { report: Some(report.display().to_string()), ..TransportSpeed::default() };
    let result = async {
        let stderr = std::fs::File::create(&log)?;
        let mut command = tokio::process::Command::new(&options.haunt);
        command
            .args(["bench", "transport", "--transport", &spec.to_string(), "--db", db.as_str()])
            .arg("--out")
            .arg(&report)
            .args(options.speed_events.iter().flat_map(|n| ["--events".to_owned(), n.to_string()]))
            .args(if inbox { &[][..] } else { &["--no-inbox"][..] })
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true);
        crate::backends::local::interrupt_when_parent_dies(command.as_std_mut());
        let status = tokio::time::timeout(SPEED_LIMIT, command.status())
            .await
            .map_err(|_| anyhow::anyhow!("haunt bench transport took longer than {SPEED_LIMIT:?}: stopped"))?
            .context("starting haunt bench transport")?;
        anyhow::ensure!(status.success(), "haunt bench transport failed ({status}); its log: {}", log.display());
        read_json(&report).with_context(|| format!("reading {}", report.display()))
    }
    .await;
    match result {
        Ok(json) => {
            let f = |v: &serde_json::Value| v.as_f64();
            speed.relay_vs_bare = f(&json["ratios"]["relay_vs_bare_publish"]);
            speed.workers_vs_bare = f(&json["ratios"]["workers_vs_bare_drain"]);
            speed.bare_publish_events_per_s = f(&json["bare_publish_events_per_s"]);
            speed.bare_drain_events_per_s = f(&json["bare_drain_events_per_s"]);
            speed.bare_events_per_s = f(&json["bare_events_per_s"]);
        }
        Err(e) => speed.error = Some(format!("{e:#}")),
    }
    Some(speed)
}

/// How `haunt guarantees` ended.
#[derive(Debug)]
pub struct GuaranteesOutcome {
    /// `guarantees.json`, `guarantees.html`, `guarantees.txt` and `runs/`.
    pub dir: PathBuf,
    pub rows: Vec<Row>,
    pub table: String,
}

impl GuaranteesOutcome {
    /// 0 when every row ran and matches its claim, 1 when a row contradicts
    /// it, 2 when a row could not be measured.
    pub fn exit_code(&self) -> i32 {
        if self.rows.iter().any(|r| r.matches_claim == Some(false)) {
            1
        } else if self.rows.iter().any(|r| r.matches_claim.is_none()) {
            2
        } else {
            0
        }
    }
}

/// Runs every row, writes the table, `guarantees.json` and `guarantees.html`.
pub fn run<'a>(
    options: &'a GuaranteesOptions,
    progress: &'a mut (dyn FnMut(&str) + Send),
) -> futures_util::future::BoxFuture<'a, anyhow::Result<GuaranteesOutcome>> {
    // Boxed, as `crate::assemble::run_interruptible` says why.
    Box::pin(run_guarantees(options, progress))
}

async fn run_guarantees(
    options: &GuaranteesOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> anyhow::Result<GuaranteesOutcome> {
    anyhow::ensure!(options.seeds > 0, "--seeds must be positive");
    anyhow::ensure!(!options.transports.is_empty(), "--transports names no transport");
    let kafka_rows = options.transports.iter().any(|s| s.kind == haunt_transport::Kind::Kafka);
    if options.kafka_server == KafkaServer::Tansu {
        anyhow::ensure!(kafka_rows, "--kafka-server tansu is the server of the Kafka rows: --transports names none");
        anyhow::ensure!(
            options.speed_db.is_none(),
            "--speed-db measures each transport on its own server, and tansu's is not among them: \
             leave it out with --kafka-server tansu"
        );
    }
    for spec in &options.transports {
        anyhow::ensure!(
            !on_tansu(options.kafka_server, *spec) || spec.mode() != "eos",
            "--transports {spec} needs Kafka's transactions, and tansu 0.6 has none: leave it out with --kafka-server tansu"
        );
    }
    for spec in &options.transports {
        if let Some(server) = spec.server() {
            let broker = crate::systems::brokers::Broker::from_name(server).context("a broker server")?;
            let broker =
                if on_tansu(options.kafka_server, *spec) { crate::systems::brokers::Broker::Tansu } else { broker };
            broker.program().with_context(|| format!("{spec}"))?;
        }
    }
    if let Some(db) = &options.speed_db {
        let store = Store::connect(db, StoreOptions::default()).await.with_context(|| format!("--speed-db {db}"))?;
        let empty = store.is_empty().await?;
        store.close().await;
        anyhow::ensure!(empty, "--speed-db {db} is not empty; the transport bench needs a database of its own");
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let dir = options.store.join("guarantees").join(stamp.to_string());
    let runs_dir = dir.join("runs");
    std::fs::create_dir_all(&runs_dir).with_context(|| format!("creating {}", runs_dir.display()))?;
    progress(&format!(
        "guarantees: {} transports, inbox and no inbox, {} seeds of {} s under faults and {} s without, into {}",
        options.transports.len(),
        options.seeds,
        options.time_limit_s,
        options.throughput_time_limit_s,
        dir.display()
    ));
    let mut rows = Vec::new();
    for &spec in &options.transports {
        for inbox in [true, false] {
            let name = format!("{spec} {}", if inbox { "inbox" } else { "no-inbox" });
            let mut runs = Vec::new();
            for seed in 1..=options.seeds {
                let run = fault_run(options, &runs_dir, spec, inbox, seed).await;
                progress(&match &run.error {
                    Some(e) => format!("{name:<32} seed {seed:<3} ERROR {e}"),
                    None => format!(
                        "{name:<32} seed {seed:<3} lost {}  delivered twice {}  applied twice {}  overtaken {} of {} pairs{}",
                        run.lost,
                        run.delivered_more_than_once.map_or("-".into(), |d| d.to_string()),
                        run.applied_more_than_once,
                        run.overtaken,
                        run.order_pairs,
                        run.repair
                            .as_ref()
                            .map_or(String::new(), |r| format!("  reconcile re-enqueued {}", r.requeued))
                    ),
                });
                runs.push(run);
            }
            let throughput = throughput_run(options, &runs_dir, spec, inbox).await;
            progress(&match (&throughput.error, throughput.events_per_s) {
                (Some(e), _) => format!("{name:<32} no faults  ERROR {e}"),
                (None, events) => {
                    format!("{name:<32} no faults  {} events/s", events.map_or("-".into(), |e| format!("{e:.0}")))
                }
            });
            let mut row = Row::new(spec, inbox, runs, throughput);
            if on_tansu(options.kafka_server, spec) {
                row.server = Some(KafkaServer::Tansu.name());
                row.brokers = 1;
            }
            row.transport_speed = speed_run(options, &runs_dir, spec, inbox).await;
            if let Some(s) = &row.transport_speed {
                progress(&match (&s.error, s.relay_vs_bare, s.workers_vs_bare) {
                    (Some(e), _, _) => format!("{name:<32} speed  ERROR {e}"),
                    (None, relay, workers) => format!(
                        "{name:<32} speed  relay {} of the bare client's publish, workers {} of its drain",
                        relay.map_or("-".into(), |r| format!("{r:.2}")),
                        workers.map_or("-".into(), |w| format!("{w:.2}"))
                    ),
                });
            }
            rows.push(row);
            // After every row, so that a guarantees run stopped half way
            // leaves what it measured.
            write_outputs(&dir, &mut rows, options, false)?;
        }
    }
    let table = write_outputs(&dir, &mut rows, options, true)?;
    Ok(GuaranteesOutcome { dir, rows, table })
}

#[cfg(test)]
mod tests;
