use super::*;
use haunt_transport::Guarantee;

fn run(seed: u64, lost: u64, delivered_twice: Option<u64>, applied_twice: u64) -> FaultRun {
    FaultRun {
        seed,
        run_dir: None,
        verdict: Some("true".into()),
        acknowledged: 100,
        lost,
        delivered_more_than_once: delivered_twice,
        redeliveries: delivered_twice,
        applied_more_than_once: applied_twice,
        unlisted: 0,
        order_pairs: 50,
        overtaken: 0,
        faults_fired: serde_json::Value::Null,
        repair: None,
        error: None,
    }
}

#[test]
fn each_claim_is_judged_by_what_it_forbids() {
    let runs = [run(1, 0, Some(3), 0), run(2, 2, Some(0), 0)];
    let refs: Vec<&FaultRun> = runs.iter().collect();
    // At-least-once that lost: a finding naming the seed.
    let (ok, finding) = judge(Guarantee::AtLeastOnce, &[], 2, Some(3), 0, &refs);
    assert_eq!(ok, Some(false));
    assert!(finding.unwrap().contains("seed 2"));
    // At-most-once that lost and never duplicated: as claimed.
    assert_eq!(judge(Guarantee::AtMostOnce, &[], 2, Some(0), 0, &refs).0, Some(true));
    // At-most-once that delivered twice: contradicted.
    assert_eq!(judge(Guarantee::AtMostOnce, &[], 2, Some(3), 0, &refs).0, Some(false));
    // At-most-once that lost nothing: as claimed, and said out loud.
    let (ok, finding) = judge(Guarantee::AtMostOnce, &[], 0, Some(0), 0, &refs);
    assert_eq!(ok, Some(true));
    assert!(finding.unwrap().contains("lose nothing"));
    // Exactly-once that applied twice (no inbox: deliveries unknown).
    assert_eq!(judge(Guarantee::ExactlyOnce, &[], 0, None, 4, &refs).0, Some(false));
    assert_eq!(judge(Guarantee::ExactlyOnce, &[], 0, None, 0, &refs), (Some(true), None));
}

/// A loss under a fault the claim excepts (`kafka:acks-1` under a
/// broker's restart) is reported as measured and matches the claim; a loss
/// in a run where no such fault struck still contradicts it.
#[test]
fn a_loss_where_the_claim_promises_nothing_is_a_finding_not_a_contradiction() {
    let spec: TransportSpec = "kafka:acks-1".parse().unwrap();
    let no_promise = spec.no_promise_under();
    assert!(no_promise.contains(&"broker-restart"), "{no_promise:?}");
    let mut restarted = run(4, 3, Some(1), 0);
    restarted.faults_fired = serde_json::json!({"kill": 1, "broker-restart": 1});
    let (ok, finding) = judge(Guarantee::AtLeastOnce, no_promise, 3, Some(1), 0, &[&restarted]);
    assert_eq!(ok, Some(true));
    let finding = finding.unwrap();
    assert!(finding.contains("promises nothing under broker-restart") && finding.contains("seed 4"), "{finding}");
    let mut killed = run(5, 2, Some(1), 0);
    killed.faults_fired = serde_json::json!({"kill": 2, "broker-restart": 0});
    let (ok, finding) = judge(Guarantee::AtLeastOnce, no_promise, 5, Some(1), 0, &[&restarted, &killed]);
    assert_eq!(ok, Some(false), "{finding:?}");
    // The same loss under at-least-once with acks=all is a contradiction.
    let all: TransportSpec = "kafka".parse().unwrap();
    assert_eq!(judge(Guarantee::AtLeastOnce, all.no_promise_under(), 3, Some(1), 0, &[&restarted]).0, Some(false));
}

/// Order is judged only where the transport claims it: overtaken orders
/// contradict `per-key` (whatever the delivery figures), a run with no pair
/// fixed in real time measured nothing, and under `none` they are figures.
#[test]
fn a_key_order_claim_is_judged_by_the_orders_overtaken() {
    let t = || Throughput { run_dir: None, events_per_s: None, effect_lag_ms_p99: None, error: None };
    let fifo: TransportSpec = "sqs:fifo".parse().unwrap();
    let db: TransportSpec = "db".parse().unwrap();
    let overtaken = |seed, n| FaultRun { overtaken: n, ..run(seed, 0, Some(1), 0) };
    let kept = Row::new(fifo, true, vec![overtaken(1, 0), overtaken(2, 0)], t());
    assert_eq!((kept.matches_claim, kept.order_pairs), (Some(true), 100));
    assert_eq!(table::order_kept(&kept), "per-key: yes");
    let broken = Row::new(fifo, true, vec![overtaken(1, 0), overtaken(2, 3)], t());
    assert_eq!(broken.matches_claim, Some(false));
    assert!(broken.finding.as_deref().unwrap().contains("3 orders were applied before"), "{:?}", broken.finding);
    assert!(broken.finding.as_deref().unwrap().contains("seed 2"));
    assert_eq!(table::order_kept(&broken), "per-key: NO, 3 overtaken");
    let unchecked = Row::new(fifo, true, vec![FaultRun { order_pairs: 0, ..run(1, 0, Some(1), 0) }], t());
    assert_eq!(unchecked.matches_claim, None, "no pair checked: the order claim was not measured");
    let lost_unchecked = Row::new(fifo, true, vec![FaultRun { order_pairs: 0, ..run(1, 2, Some(1), 0) }], t());
    assert_eq!(lost_unchecked.matches_claim, Some(false), "a loss is a contradiction whatever the order showed");
    let figures = Row::new(db, true, vec![overtaken(1, 7)], t());
    assert_eq!(figures.matches_claim, Some(true), "the database queue claims no order");
    assert_eq!(table::order_kept(&figures), "none: 7 overtaken");
}

/// A row's speed is the lower of its transport bench's two ratios; a mode's
/// speed is its bare rate over the bare rate of its broker's first mode,
/// and nothing where that mode has no row.
#[test]
fn speed_is_the_transports_own_ratio_and_a_modes_is_against_its_first_mode() {
    let t = |e| Throughput { run_dir: None, events_per_s: e, effect_lag_ms_p99: None, error: None };
    let measured = |relay, workers, bare| TransportSpeed {
        relay_vs_bare: Some(relay),
        workers_vs_bare: Some(workers),
        bare_events_per_s: Some(bare),
        ..TransportSpeed::default()
    };
    let row = |spec: &str, speed: Option<TransportSpeed>| {
        // The at-most-once row without the inbox, as the tutorial's line reads it.
        let inbox = spec != "rabbitmq:auto-ack";
        let mut r = Row::new(spec.parse().unwrap(), inbox, vec![run(1, 0, Some(1), 0)], t(Some(100.0)));
        r.transport_speed = speed;
        r
    };
    let mut rows = vec![
        row("rabbitmq:auto-ack", Some(measured(0.9, 0.5, 3000.0))),
        row("rabbitmq", Some(measured(0.7, 0.8, 2000.0))),
        row("mqtt:qos2", Some(measured(0.6, 0.9, 500.0))),
        row("db", None),
        row("nats", Some(TransportSpeed { error: Some("failed".into()), ..TransportSpeed::default() })),
    ];
    set_speeds(&mut rows);
    assert_eq!(rows.iter().map(|r| r.speed).collect::<Vec<_>>(), [Some(0.5), Some(0.7), Some(0.6), None, None]);
    assert_eq!(rows.iter().map(|r| r.mode_speed).collect::<Vec<_>>(), [Some(1.5), Some(1.0), None, None, None]);
    let text = table::table(&rows, "haunt guarantees");
    assert!(text.contains("at-most-once") && text.contains(" / 1.50 "), "{text}");
    assert!(text.contains("nats:jetstream inbox speed: failed"), "an error is listed as not measured: {text}");
    // A mode's base is the first mode on its broker's server.
    assert_eq!(first_mode("redis-pubsub".parse().unwrap()).to_string(), "redis-streams");
    assert_eq!(first_mode("kafka:eos".parse().unwrap()), "kafka".parse::<TransportSpec>().unwrap());
}

#[test]
fn the_fault_schedule_reaches_the_broker_and_the_relay_only_where_there_are_some() {
    use Fault::*;
    let (faults, targets) = fault_schedule(KafkaServer::Kafka, "db".parse().unwrap());
    assert_eq!((faults, targets), (vec![Kill, Partition, AckLoss], vec!["worker-1".into(), "worker-1<->db".into()]));
    let (faults, targets) = fault_schedule(KafkaServer::Kafka, "rabbitmq".parse().unwrap());
    assert_eq!(faults, [Kill, BrokerRestart, Partition, AckLoss, RelayKill]);
    assert_eq!(targets, ["worker-1", "worker-1<->broker", "relay"]);
    let (faults, _) = fault_schedule(KafkaServer::Kafka, "sqs".parse().unwrap());
    assert!(!faults.contains(&BrokerRestart), "moto keeps nothing through a restart: {faults:?}");
    // On a Kafka cluster a partition may cut any node off: a leader's failover.
    let (_, targets) = fault_schedule(KafkaServer::Kafka, "kafka:acks-1".parse().unwrap());
    for n in 1..=3 {
        assert!(targets.contains(&format!("broker-{n}<->all")), "{targets:?}");
    }
    assert!(targets.contains(&"leader<->all".to_owned()), "or the leader of partition 0: {targets:?}");
    let (_, targets) = fault_schedule(KafkaServer::Kafka, "kafka:eos".parse().unwrap());
    assert!(!targets.iter().any(|t| t.contains("<->all")), "eos runs on one broker: {targets:?}");
    // tansu: one node, whose clients share one link; the other rows keep theirs.
    let (faults, targets) = fault_schedule(KafkaServer::Tansu, "kafka".parse().unwrap());
    assert_eq!(faults, [Kill, BrokerRestart, Partition, AckLoss, RelayKill]);
    assert_eq!(targets, ["worker-1", "clients<->broker", "relay"]);
    assert_eq!(
        fault_schedule(KafkaServer::Tansu, "rabbitmq".parse().unwrap()).1,
        ["worker-1", "worker-1<->broker", "relay"]
    );
}

/// A row that contradicts its claim names the shrink command of each of its
/// failing runs; a row that matches names none.
#[test]
fn a_contradicted_row_says_how_to_shrink_its_failing_runs() {
    let t = Throughput { run_dir: None, events_per_s: None, effect_lag_ms_p99: None, error: None };
    let spec: TransportSpec = "db".parse().unwrap();
    let mut lost = run(2, 1, Some(0), 0);
    lost.verdict = Some("false".into());
    lost.run_dir = Some("/runs/seed-2".into());
    let mut fine = run(1, 0, Some(1), 0);
    fine.run_dir = Some("/runs/seed-1".into());
    let contradicted = Row::new(spec, true, vec![fine.clone(), lost], t.clone());
    assert_eq!(contradicted.matches_claim, Some(false));
    let text = super::table::table(&[contradicted], "haunt guarantees");
    assert!(text.contains("shrink: haunt shrink /runs/seed-2"), "{text}");
    assert!(!text.contains("haunt shrink /runs/seed-1"), "{text}");
    let matched = Row::new(spec, true, vec![fine], t);
    assert!(!super::table::table(&[matched], "haunt guarantees").contains("haunt shrink"));
}

/// A row on tansu says so, on a line as wide as the others, and the table's
/// command names the server, so that it reproduces the rows.
#[test]
fn a_row_on_tansu_is_named_so_and_its_command_names_the_server() {
    let t = Throughput { run_dir: None, events_per_s: Some(100.0), effect_lag_ms_p99: None, error: None };
    let mut on_tansu = Row::new("kafka".parse().unwrap(), true, vec![run(1, 0, Some(1), 0)], t.clone());
    on_tansu.server = Some("tansu");
    on_tansu.brokers = 1;
    let db = Row::new("db".parse().unwrap(), true, vec![run(1, 0, Some(1), 0)], t);
    let text = table::table(&[db, on_tansu], "haunt guarantees");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("db ") || l.starts_with("kafka")).collect();
    assert!(lines[1].starts_with("kafka:at-least-once on tansu yes"), "{text}");
    let inbox_column = |l: &str| l.find(" yes ").unwrap();
    assert_eq!(inbox_column(lines[0]), inbox_column(lines[1]), "columns line up:\n{text}");

    let dir = tempfile::tempdir().unwrap();
    let options = GuaranteesOptions {
        haunt: "haunt".into(),
        store: dir.path().into(),
        transports: vec!["kafka".parse().unwrap()],
        seeds: 1,
        time_limit_s: 20,
        throughput_time_limit_s: 10,
        speed_db: None,
        speed_events: None,
        kafka_server: KafkaServer::Tansu,
    };
    let text = table::write_outputs(dir.path(), &mut [], &options, true).unwrap();
    assert!(text.contains("--kafka-server tansu"), "{text}");
}
