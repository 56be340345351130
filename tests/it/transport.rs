//! `haunt run --transport`: the pipeline over a real broker the run starts,
//! with the relay between the outbox and the broker, under faults that reach
//! the broker too.
//!
//! For each transport's at-least-once mode: a short run under a consumer
//! kill, a broker restart, a consumer<->broker partition and ack loss is
//! valid, every one of those faults fired, and redeliveries were recorded;
//! without the inbox, lost acks are caught as `double-applied`. An
//! at-most-once mode loses effects when its only consumer dies, and the
//! checker says `lost-effect`.
//!
//! They need the broker servers `scripts/brokers` installs; without one the
//! run fails naming it, unless `HAUNT_SKIP_BROKERS=1` says to skip these,
//! and then each skip is printed.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::run::{haunt_run, latest, read_json};

/// A consumer kill, a broker restart, a consumer<->broker partition and ack
/// loss, in 24 s: the kill takes a worker, the partition its link to the broker.
/// The schedule's first round fires each kind once if it fits before the
/// deadline, and a heal takes what it takes: on a slow VM (2026-12-02) a
/// partition's heal inside a container took 4.3 s and the broker's restart
/// 1.7 s, so in 16 s the last kind of the round started at 14.6 s (seed 5),
/// and once did not fit at all (the run listed it as never fired). 24 s
/// leaves the round room on such a machine.
pub(crate) const BROKER_FAULTS: &[&str] = &[
    "--time-limit-s",
    "24",
    "--nemesis",
    "kill,broker-restart,partition,ack-loss",
    "--nemesis-interval-s",
    "1.5",
    "--visibility-timeout-ms",
    "1000",
    "--fault-targets",
    "worker-1,worker-1<->broker",
];

/// [`BROKER_FAULTS`], with the broker's restart or without it (for a broker
/// that loses what it confirmed across one, or keeps nothing).
pub(crate) fn broker_faults(restart: bool) -> Vec<&'static str> {
    BROKER_FAULTS
        .iter()
        .map(|&a| if a.contains("broker-restart") && !restart { "kill,partition,ack-loss" } else { a })
        .collect()
}

fn skipped(transport: &str) -> bool {
    let own = match transport.split(':').next() {
        Some("pubsub") => Some("HAUNT_SKIP_PUBSUB"),
        Some("kafka") => Some("HAUNT_SKIP_KAFKA"),
        _ => None,
    };
    for opt_out in ["HAUNT_SKIP_BROKERS"].into_iter().chain(own) {
        if std::env::var(opt_out).as_deref() == Ok("1") {
            eprintln!("SKIPPED: haunt run --transport {transport} ({opt_out}=1)");
            return true;
        }
    }
    false
}

fn run(store: &Path, transport: &str, args: &[&str]) -> (Output, Value, Value) {
    let out =
        haunt_run(store, &[&["--transport", transport, "--quiet", "--seed", "7"], args].concat()).output().unwrap();
    let dir = latest(store);
    let results = if dir.join("results.json").exists() { read_json(&dir.join("results.json")) } else { Value::Null };
    (out, results, read_json(&dir.join("run.json")))
}

fn why(out: &Output, results: &Value) -> String {
    format!("{}\n{}\n{results}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A consumer kill, a broker restart, a consumer<->broker partition and ack
/// loss: valid, each fault fired, redeliveries recorded and absorbed.
fn at_least_once_is_valid_under_broker_faults(transport: &str) {
    at_least_once_is_valid(transport, true);
}

/// As [`at_least_once_is_valid_under_broker_faults`]; `restart: false` leaves
/// `broker-restart` out, for a broker known to lose what it confirmed.
fn at_least_once_is_valid(transport: &str, restart: bool) {
    if skipped(transport) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // moto, the SQS emulator, keeps its queues in memory: its restart would
    // lose them whatever SQS does, so haunt does not offer it there.
    let spec: haunt_transport::TransportSpec = transport.parse().unwrap();
    let restart = restart && spec.server_is_durable();
    let faults = broker_faults(restart);
    let (out, results, run) = run(tmp.path(), transport, &faults);
    assert_eq!(out.status.code(), Some(0), "{}", why(&out, &results));
    assert_eq!(run["transport"], spec.to_string(), "run.json names the transport");
    assert_eq!(run["order_claim"], spec.order_claim().name(), "run.json says what the transport claims of order");
    let fired = &run["faults_fired"];
    let expected = if restart {
        &["kill", "broker-restart", "partition", "ack-loss"][..]
    } else {
        &["kill", "partition", "ack-loss"][..]
    };
    for &fault in expected {
        assert!(fired[fault].as_u64().unwrap_or(0) >= 1, "{fault} never fired: {run}");
    }
    let delivery = &results["delivery"];
    if spec.counts_deliveries() {
        assert!(delivery["redeliveries"].as_u64().unwrap() > 0, "no redelivery recorded: {delivery}");
        assert!(delivery["duplicates_absorbed"].as_u64().unwrap() > 0, "no duplicate absorbed: {delivery}");
    } else {
        let history = std::fs::read_to_string(latest(tmp.path()).join("history.jsonl")).unwrap();
        a_held_kill_comes_again(&history, &results, transport);
    }
    assert!(results["counts"]["acknowledged"].as_u64().unwrap() > 100, "{results}");
    if spec.order_claim() == haunt_transport::OrderClaim::PerKey {
        // Judged, not merely claimed: pairs fixed in real time were checked,
        // and none was applied out of order.
        let order = &results["order"];
        assert_eq!(order["claim"], "per-key", "{order}");
        assert!(order["pairs_checked"].as_u64().unwrap() > 100, "{order}");
        assert_eq!(results["anomalies"]["reordered"]["count"], 0, "{order}");
    }
}

/// For a transport whose acks are cumulative (Kafka's offsets): a lost
/// commit is covered by the next, so only a consumer killed with its offsets
/// uncommitted redelivers. A kill of `worker-1` aimed at a held batch (its
/// effects committed, its offsets not) must come again, as duplicates the
/// inbox absorbed. A run whose one such kill found no batch within its wait
/// (a broker restarting, or the machine loaded) holds no claim either way,
/// and says so.
pub(crate) fn a_held_kill_comes_again(history: &str, results: &Value, test: &str) {
    let held = history
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .any(|op| op["f"] == "kill" && op["value"]["target"] == "worker-1" && op["value"]["aim"]["held"] == true);
    let absorbed = results["delivery"]["duplicates_absorbed"].as_u64().unwrap();
    assert!(!held || absorbed > 0, "{test}: a kill held a batch, and nothing came again: {}", results["delivery"]);
    eprintln!("{test}: a kill held a batch: {held}; duplicates absorbed: {absorbed}");
}

/// Without the inbox, an ack the ack-loss fault drops is a second application.
fn no_inbox_is_caught_as_double_applied(transport: &str) {
    if skipped(transport) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--time-limit-s", "8", "--nemesis", "ack-loss", "--nemesis-interval-s", "1"];
    let (out, results, _) =
        run(tmp.path(), transport, &[&args[..], &["--visibility-timeout-ms", "800", "--bug", "no-inbox"]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", why(&out, &results));
    assert!(results["anomalies"]["double-applied"]["count"].as_u64().unwrap() > 0, "{results}");
}

/// The only consumer killed: what was settled on receipt, or published while
/// nobody listened, is gone.
///
/// A broker that keeps its queue while nobody consumes (RabbitMQ with
/// auto-ack) loses only what the consumer holds when it dies: what the
/// broker sent it and it had not applied. At the default 100 orders/s the
/// worker holds nothing about half of the time, and once every kill of a CI
/// run missed (the relay also lost the run's first seconds to its reconnect
/// backoff then; runs now start once it is connected). At 500/s the worker
/// held deliveries at 17 of 18 kills over four seeds (2026-12-02, the 2-core
/// VM, a debug build): every kill of a run missing is a chance near 10⁻⁵.
fn at_most_once_loses_under_a_consumer_kill(transport: &str) {
    if skipped(transport) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // Kafka's consumers form a group, which rebalances after each kill
    // until the dead members' sessions time out (6 s): kills a second apart
    // all landed in rebalances, with no batch in hand to lose (a CI run,
    // 2026-12-05). See `consumer_kills`.
    let (time_limit, interval) = consumer_kills(transport).unwrap_or(("10", "1"));
    let args = ["--time-limit-s", time_limit, "--nemesis", "kill", "--nemesis-interval-s", interval, "--workers", "1"];
    let args = [&args[..], &["--rate", "500", "--fault-targets", "worker-1"]].concat();
    let (out, results, _) = run(tmp.path(), transport, &args);
    assert!(!results.is_null(), "the run was checked: {}", why(&out, &results));
    // An aimed kill holds the batch where the consumer has settled it and
    // not applied it, never after its effect, where it has nothing to lose.
    let history = std::fs::read_to_string(latest(tmp.path()).join("history.jsonl")).unwrap();
    for op in history.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()) {
        if op["value"]["aim"]["held"] == true {
            assert_eq!(op["value"]["aim"]["point"], "acked-not-applied", "{op}");
        }
    }
    assert_eq!(out.status.code(), Some(1), "{}", why(&out, &results));
    assert!(results["anomalies"]["lost-effect"]["count"].as_u64().unwrap() > 0, "{results}");
}

/// The relay deletes what it published without waiting for the broker's
/// confirmation (`--bug no-publisher-confirms`), and its link to the broker
/// is cut: what it publishes during the cut sits in the network until the
/// link heals and the connection dies with it. Every cut loses what the
/// relay published in it, so the run must say `lost-effect`. (A broker
/// crash instead drops only what is in flight at that instant: 2 of 5 seeds
/// over RabbitMQ, `docs/transports.md`.) The correct relay under the same
/// cut is valid: `relay_cut_from_the_broker_with_confirms_loses_nothing`.
fn unconfirmed_publishes_are_lost_when_the_relay_is_cut_off(transport: &str) {
    if skipped(transport) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--time-limit-s",
        "8",
        "--nemesis",
        "partition",
        "--fault-targets",
        "relay<->broker",
        "--visibility-timeout-ms",
        "1000",
        "--bug",
        "no-publisher-confirms",
    ];
    let (out, results, _) = run(tmp.path(), transport, &args);
    assert!(!results.is_null(), "the run was checked: {}", why(&out, &results));
    // An aimed kill holds the batch where the consumer has settled it and
    // not applied it, never after its effect, where it has nothing to lose.
    let history = std::fs::read_to_string(latest(tmp.path()).join("history.jsonl")).unwrap();
    for op in history.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()) {
        if op["value"]["aim"]["held"] == true {
            assert_eq!(op["value"]["aim"]["point"], "acked-not-applied", "{op}");
        }
    }
    assert_eq!(out.status.code(), Some(1), "{}", why(&out, &results));
    assert!(results["anomalies"]["lost-effect"]["count"].as_u64().unwrap() > 0, "{results}");
}

#[test]
fn rabbitmq_without_publisher_confirms_loses_when_the_relay_is_cut_off() {
    unconfirmed_publishes_are_lost_when_the_relay_is_cut_off("rabbitmq");
}

#[test]
fn nats_jetstream_without_publish_acks_loses_when_the_relay_is_cut_off() {
    unconfirmed_publishes_are_lost_when_the_relay_is_cut_off("nats");
}

#[test]
fn mqtt_qos1_without_pubacks_loses_when_the_relay_is_cut_off() {
    unconfirmed_publishes_are_lost_when_the_relay_is_cut_off("mqtt");
}

/// The same cut with confirmations: the relay keeps every row the broker
/// did not confirm and publishes it again once the link is back.
#[test]
fn relay_cut_from_the_broker_with_confirms_loses_nothing() {
    let transport = "rabbitmq";
    if skipped(transport) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--time-limit-s", "8", "--nemesis", "partition", "--fault-targets", "relay<->broker"];
    let (out, results, run) = run(tmp.path(), transport, &[&args[..], &["--visibility-timeout-ms", "1000"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", why(&out, &results));
    assert_eq!(results["valid"], true, "{results}");
    assert!(run["faults_fired"]["partition"].as_u64().unwrap() > 0, "the link was cut: {run}");
    assert!(results["counts"]["applied_events"].as_u64().unwrap() > 200, "{results}");
}

#[test]
fn redis_streams_is_valid_under_broker_faults() {
    at_least_once_is_valid_under_broker_faults("redis-streams");
}

#[test]
fn redis_streams_without_an_inbox_double_applies() {
    no_inbox_is_caught_as_double_applied("redis-streams");
}

#[test]
fn redis_pubsub_loses_under_a_consumer_kill() {
    at_most_once_loses_under_a_consumer_kill("redis-pubsub");
}

/// RabbitMQ has no visibility timeout: the run sets its `consumer_timeout`
/// to the visibility timeout, so a delivery whose ack was lost comes back
/// when the broker closes the channel that held it.
#[test]
fn rabbitmq_manual_ack_is_valid_under_broker_faults() {
    at_least_once_is_valid_under_broker_faults("rabbitmq");
}

#[test]
fn rabbitmq_without_an_inbox_double_applies() {
    no_inbox_is_caught_as_double_applied("rabbitmq");
}

#[test]
fn rabbitmq_auto_ack_loses_under_a_consumer_kill() {
    at_most_once_loses_under_a_consumer_kill("rabbitmq:auto-ack");
}

#[test]
fn nats_jetstream_is_valid_under_broker_faults() {
    at_least_once_is_valid_under_broker_faults("nats");
}

#[test]
fn nats_jetstream_without_an_inbox_double_applies() {
    no_inbox_is_caught_as_double_applied("nats");
}

#[test]
fn nats_core_loses_under_a_consumer_kill() {
    at_most_once_loses_under_a_consumer_kill("nats:core");
}

#[test]
fn sqs_standard_on_moto_is_valid_under_consumer_faults() {
    at_least_once_is_valid_under_broker_faults("sqs");
}

#[test]
fn sqs_standard_without_an_inbox_double_applies() {
    no_inbox_is_caught_as_double_applied("sqs");
}

/// FIFO, one message group per key (the order's item): a consumer killed
/// holding a group's batch holds the whole key back for the visibility
/// timeout, and the run still drains, valid.
#[test]
fn sqs_fifo_on_moto_is_valid_under_consumer_faults() {
    at_least_once_is_valid_under_broker_faults("sqs:fifo");
}

/// Failed applies on a broker that keeps each key's order: two clients on
/// two keys put about five orders of a key in a batch of ten, and the
/// db-error fault fails three applies in ten. The correct worker hands a
/// failed delivery's later deliveries of its key back with it, and every
/// key keeps its order; the worker of bug mode `retry-after-next` applies
/// them while the failed one waits out its backoff, caught as `reordered`
/// (10 of 10 seeds of `haunt matrix --transport sqs:fifo` in 15 s, 7 to 33
/// orders overtaken a run over two db-error windows). The errors are drawn
/// afresh in each process, so the runs are 20 s: three windows rather
/// than two.
#[test]
fn sqs_fifo_keeps_each_keys_order_through_failed_applies_and_retry_after_next_breaks_it() {
    keeps_each_keys_order_and_retry_after_next_breaks_it("sqs:fifo");
}

/// The same over Pub/Sub with message ordering: the consumer gives a failed
/// delivery back by a deadline of 1 s, not a nack, which the emulator
/// answers out of order (`chaos/tests/it/transports.rs`).
#[test]
fn pubsub_ordered_keeps_each_keys_order_through_failed_applies_and_retry_after_next_breaks_it() {
    keeps_each_keys_order_and_retry_after_next_breaks_it("pubsub:ordered");
}

#[test]
fn pubsub_pull_is_valid_under_consumer_faults() {
    at_least_once_is_valid("pubsub:pull", false);
}

#[test]
fn pubsub_pull_without_an_inbox_double_applies() {
    no_inbox_is_caught_as_double_applied("pubsub:pull");
}

/// Exactly-once delivery under the same faults: valid with the inbox, and
/// the redeliveries a dropped ack brings are still there (the claim is
/// about acks that succeeded).
#[test]
fn pubsub_exactly_once_is_valid_under_consumer_faults() {
    at_least_once_is_valid("pubsub:exactly-once", false);
}

/// Ordered, under the same faults: valid, and (a per-key claim) no key's
/// order broken over the pairs checked.
#[test]
fn pubsub_ordered_is_valid_under_consumer_faults() {
    at_least_once_is_valid("pubsub:ordered", false);
}

#[test]
fn pubsub_ordered_without_an_inbox_double_applies() {
    no_inbox_is_caught_as_double_applied("pubsub:ordered");
}

/// Exactly-once delivery is the broker's, not the effect's: an ack that
/// the ack-loss fault drops brings the message back, and without the inbox
/// it is applied twice.
#[test]
fn pubsub_exactly_once_without_an_inbox_double_applies() {
    no_inbox_is_caught_as_double_applied("pubsub:exactly-once");
}

/// A transport that claims each key's order keeps it through failed
/// applies, and the bug mode that retries a failed delivery after the next
/// one breaks it.
fn keeps_each_keys_order_and_retry_after_next_breaks_it(transport: &str) {
    if skipped(transport) {
        return;
    }
    let args = [
        "--time-limit-s",
        "20",
        "--nemesis",
        "db-error",
        "--visibility-timeout-ms",
        "1000",
        "--concurrency",
        "2",
        "--ordered-keys",
        "2",
    ];
    let tmp = tempfile::tempdir().unwrap();
    let (out, results, _) = run(tmp.path(), transport, &args);
    assert_eq!(out.status.code(), Some(0), "{}", why(&out, &results));
    let order = &results["order"];
    assert!(order["pairs_checked"].as_u64().unwrap() > 1000, "{order}");
    assert_eq!(results["anomalies"]["reordered"]["count"], 0, "{order}");
    // The failed applies met later orders of their key in their batch, and
    // held them back.
    let logs = latest(tmp.path()).join("logs");
    let held: usize = std::fs::read_dir(&logs)
        .unwrap()
        .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap_or_default())
        .map(|log| log.matches("handed back behind it, unapplied").count())
        .sum();
    assert!(held > 0, "no delivery was held back behind a failed one: {}", logs.display());

    let tmp = tempfile::tempdir().unwrap();
    let (out, results, _) = run(tmp.path(), transport, &[&args[..], &["--bug", "retry-after-next"]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", why(&out, &results));
    let order = &results["order"];
    assert!(results["anomalies"]["reordered"]["count"].as_u64().unwrap() > 0, "{order}");
    // Attributed: the relay published every key in order (the applications
    // carry its publish sequence), and the orders were overtaken by ones
    // the bug handed back, which took effect on a redelivery.
    assert_eq!(order["overtaken_in_publish"], 0, "{order}");
    assert!(order["overtaken_after_redelivery"].as_u64().unwrap() > 0, "{order}");
}

#[test]
fn kafka_is_valid_under_broker_faults() {
    at_least_once_is_valid_under_broker_faults("kafka");
}

/// The time limit and nemesis interval of a run whose kills must find a
/// Kafka consumer holding a batch, `None` for other transports. A group
/// moves for seconds after its start and after each kill, so a kill may land
/// while the consumer holds nothing: 40 s with kills 5 s apart fits four
/// kills about 9 s apart (a kill lasts until its restart), two of them aimed
/// (the first and the third), so that one landing while the group moves still
/// leaves another; 30 s fits only two, one aimed (2026-12-06).
fn consumer_kills(transport: &str) -> Option<(&'static str, &'static str)> {
    let spec: haunt_transport::TransportSpec = transport.parse().unwrap();
    (spec.kind == haunt_transport::Kind::Kafka).then_some(("40", "5"))
}

/// Kafka commits offsets, and a commit covers every offset below it: an ack
/// the ack-loss fault drops is covered by the next commit, and alone brings
/// nothing back. A consumer killed between the effect and its commit does:
/// its partitions' next owner reads from the last commit.
fn no_inbox_double_applies_after_a_consumer_kill(transport: &str) {
    if skipped(transport) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // Only an aimed kill (the first and every other) lands between the effect
    // and the ack, and only if the consumer has a batch within the aim's
    // wait. Kafka's group moves for seconds after its start and after each
    // kill: under a loaded suite (2026-12-06) its one kill in 12 s found no
    // batch and landed blind (seed 7 of the run below: kills at 5.5 s and
    // 23.4 s, both holding a batch before its ack). See `consumer_kills`.
    let (time_limit, interval) = consumer_kills(transport).unwrap_or(("12", "5"));
    let args = ["--time-limit-s", time_limit, "--nemesis-interval-s", interval, "--nemesis", "kill"];
    let args = [&args[..], &["--fault-targets", "worker-1", "--bug", "no-inbox"]].concat();
    let (out, results, _) = run(tmp.path(), transport, &args);
    assert_eq!(out.status.code(), Some(1), "{}", why(&out, &results));
    assert!(results["anomalies"]["double-applied"]["count"].as_u64().unwrap() > 0, "{results}");
}

#[test]
fn kafka_without_an_inbox_double_applies() {
    no_inbox_double_applies_after_a_consumer_kill("kafka");
}

/// The tutorial's point, measured: Kafka's exactly-once (a transactional
/// producer, read_committed consumers) ends at Kafka's edge. The effect is
/// in the database, and without the inbox a consumer killed before its
/// commit has it applied twice.
#[test]
fn kafka_eos_without_an_inbox_double_applies() {
    no_inbox_double_applies_after_a_consumer_kill("kafka:eos");
}

#[test]
fn kafka_at_most_once_loses_under_a_consumer_kill() {
    at_most_once_loses_under_a_consumer_kill("kafka:at-most-once");
}

/// tansu, a Kafka-compatible broker, runs only where it is installed
/// (`HAUNT_BROKERS=tansu scripts/brokers`, a long build): `HAUNT_SKIP_TANSU=1`
/// skips its runs, and says so.
fn tansu_skipped() -> bool {
    for opt_out in ["HAUNT_SKIP_BROKERS", "HAUNT_SKIP_TANSU"] {
        if std::env::var(opt_out).as_deref() == Ok("1") {
            eprintln!("SKIPPED: haunt run --transport kafka --kafka-server tansu ({opt_out}=1)");
            return true;
        }
    }
    false
}

/// Kafka's transport on tansu (`--kafka-server tansu`): under consumer kills
/// aimed at a held batch, broker restarts, cuts of the clients' one link and
/// lost commits, nothing is lost, what a killed consumer held comes again
/// and is absorbed, and each key's order holds. The kills are 5 s apart, as
/// over Apache Kafka: the classic group stops at every change.
#[test]
fn kafka_on_tansu_is_valid_under_broker_faults() {
    if tansu_skipped() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--kafka-server",
        "tansu",
        "--time-limit-s",
        "40",
        "--nemesis",
        "kill,broker-restart,partition,ack-loss",
        "--nemesis-interval-s",
        "5",
        "--fault-targets",
        "worker-1,clients<->broker",
        "--ordered-keys",
        "4",
    ];
    let (out, results, run) = run(tmp.path(), "kafka", &args);
    assert_eq!(out.status.code(), Some(0), "{}", why(&out, &results));
    assert_eq!(run["options"]["kafka_server"], "tansu", "{run}");
    for fault in ["kill", "broker-restart", "partition", "ack-loss"] {
        assert!(run["faults_fired"][fault].as_u64().unwrap_or(0) >= 1, "{fault} never fired: {run}");
    }
    assert!(results["counts"]["acknowledged"].as_u64().unwrap() > 100, "{results}");
    let history = std::fs::read_to_string(latest(tmp.path()).join("history.jsonl")).unwrap();
    a_held_kill_comes_again(&history, &results, "kafka on tansu");
    assert!(results["order"]["pairs_checked"].as_u64().unwrap() > 100, "{}", results["order"]);
    assert_eq!(results["anomalies"]["reordered"]["count"], 0, "{}", results["order"]);
}

/// `kafka:at-most-once` on tansu: the consumer commits before the effect,
/// so a consumer killed holding a batch loses it, and the checker says so.
#[test]
fn kafka_at_most_once_on_tansu_loses_under_a_consumer_kill() {
    if tansu_skipped() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--kafka-server", "tansu", "--time-limit-s", "40", "--nemesis", "kill", "--nemesis-interval-s", "5"];
    let args = [&args[..], &["--workers", "1", "--rate", "500", "--fault-targets", "worker-1"]].concat();
    let (out, results, _) = run(tmp.path(), "kafka:at-most-once", &args);
    assert_eq!(out.status.code(), Some(1), "{}", why(&out, &results));
    assert!(results["anomalies"]["lost-effect"]["count"].as_u64().unwrap() > 0, "{results}");
}

/// A cluster of three (`--kafka-brokers 3`): the leader of partition 0 cut
/// off from its peers and its clients (`leader<->all`, resolved as the cut
/// comes), then a node killed and restarted. acks=all with
/// min.insync.replicas 2 loses nothing and keeps each key's order, each
/// fault's start names the partition leaders as it struck, and the node cut
/// off is the one they name for partition 0.
#[test]
fn a_kafka_cluster_is_valid_when_its_leader_is_isolated_and_a_node_is_restarted() {
    if skipped("kafka") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--kafka-brokers",
        "3",
        // A node's restart lasts until it serves again (11 to 14 s, longer on
        // a loaded machine): 30 s left the partition no room after it.
        "--time-limit-s",
        "50",
        "--nemesis",
        "partition,broker-restart",
        "--nemesis-interval-s",
        "3",
        "--fault-targets",
        "leader<->all",
        "--ordered-keys",
        "4",
    ];
    let (out, results, run) = run(tmp.path(), "kafka", &args);
    assert_eq!(out.status.code(), Some(0), "{}", why(&out, &results));
    assert_eq!(run["options"]["kafka_brokers"], 3, "{run}");
    for fault in ["partition", "broker-restart"] {
        assert!(run["faults_fired"][fault].as_u64().unwrap_or(0) >= 1, "{fault} never fired: {run}");
    }
    assert!(results["counts"]["acknowledged"].as_u64().unwrap() > 100, "{results}");
    assert_eq!(results["anomalies"]["reordered"]["count"], 0, "{}", results["order"]);
    assert!(results["order"]["pairs_checked"].as_u64().unwrap() > 100, "{}", results["order"]);
    // Each window names the leaders as it struck: every partition led by
    // some node (or none), each once.
    let windows = results["faults"].as_array().unwrap();
    let isolated = windows.iter().find(|w| w["fault"] == "partition").expect("a partition window");
    assert_eq!(isolated["target"], "leader<->all", "{isolated}");
    // Each cut names the node it isolated, which led partition 0 as it struck.
    let history = std::fs::read_to_string(latest(tmp.path()).join("history.jsonl")).unwrap();
    let ops: Vec<Value> = history.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut cuts = 0;
    for (i, op) in
        ops.iter().enumerate().filter(|(_, op)| op["f"] == "start-partition" && op["value"]["result"] == "ok")
    {
        let before = ops[..i].iter().rev().find(|o| o["f"] == "start-partition").unwrap();
        let leader = before["value"]["leaders"]
            .as_object()
            .and_then(|l| l.iter().find(|(_, p)| p.as_array().unwrap().contains(&Value::from(0))))
            .map(|(node, _)| node.clone())
            .unwrap_or_else(|| panic!("the leader of partition 0 as it struck: {before}"));
        assert_eq!(op["value"]["aim"]["link"], format!("{leader}<->all"), "{before}\n{op}");
        cuts += 1;
    }
    assert!(cuts >= 1, "a cut of the leader");
    for w in windows {
        let leaders = w["leaders"].as_object().unwrap_or_else(|| panic!("no leaders: {w}"));
        let mut partitions: Vec<u64> =
            leaders.values().flat_map(|p| p.as_array().unwrap().iter().map(|n| n.as_u64().unwrap())).collect();
        partitions.sort_unstable();
        assert_eq!(partitions, (0..8).collect::<Vec<u64>>(), "{w}");
        assert!(leaders.keys().all(|k| k.starts_with("broker-") || k == "none"), "{w}");
    }
}

#[test]
fn kafka_keeps_each_keys_order_through_failed_applies_and_retry_after_next_breaks_it() {
    keeps_each_keys_order_and_retry_after_next_breaks_it("kafka");
}

/// MQTT resends an unacked message only to a reconnecting session: the
/// consumer reconnects once a delivery has waited past the visibility
/// timeout for its ack. Without `broker-restart`: after a restart mosquitto
/// 2.0.11 drops what is published before the workers' sessions reconnect
/// (their shared subscription is gone until then), so a restart loses
/// messages it confirmed (`haunt guarantees` measured it:
/// `docs/guarantees.md`; `chaos/tests/it/transports.rs` shows it alone).
#[test]
fn mqtt_qos1_is_valid_under_consumer_faults() {
    at_least_once_is_valid("mqtt", false);
}

#[test]
fn mqtt_qos1_without_an_inbox_double_applies() {
    no_inbox_is_caught_as_double_applied("mqtt");
}

/// QoS 2 under the same faults as QoS 1 (broker-restart left out for the
/// same reason): a backlog the relay publishes in batches larger than the
/// broker's in-flight window, and sessions that reconnect owing a PUBCOMP.
#[test]
fn mqtt_qos2_is_valid_under_consumer_faults() {
    at_least_once_is_valid("mqtt:qos2", false);
}

/// QoS 2 is exactly-once between a client and the broker, not to the
/// effect: a lost ack is a resend, and without the inbox a second effect.
#[test]
fn mqtt_qos2_without_an_inbox_double_applies() {
    no_inbox_is_caught_as_double_applied("mqtt:qos2");
}

#[test]
fn mqtt_qos0_loses_under_a_consumer_kill() {
    at_most_once_loses_under_a_consumer_kill("mqtt:qos0");
}

#[test]
fn a_transport_that_does_not_exist_or_a_relay_bug_without_a_broker_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let out = haunt_run(tmp.path(), &["--transport", "kafkaesque"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("unknown transport") && stderr.contains("redis-streams"), "{stderr}");
    let out = haunt_run(tmp.path(), &["--bug", "relay-marks-before-publish", "--time-limit-s", "5"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("--transport"), "{stderr}");
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none(), "a refused run creates nothing");
}
