//! Property tests: random valid runs pass; the same run with one injected
//! anomaly reports that anomaly, naming the affected order, and nothing that the
//! injection does not imply.

use std::collections::BTreeMap;

use haunt_checker::{Results, Verdict, check_readers};
use haunt_format::{
    Applied, DeadLetter, FinalLine, JsonlWriter, Meta, Op, OpType, OpValue, OrderRow, OrderValue, Pending, Process,
    ProjectionRow,
};
use proptest::prelude::*;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Ok,
    Fail,
    Info,
}

/// What the final state holds for an order that may be present.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Applied,
    Pending,
    DeadLetter,
    /// Only honoured for indeterminate orders: the attempt never committed.
    Absent,
}

#[derive(Debug, Clone)]
struct Plan {
    attempts: Vec<Outcome>,
    fate: Fate,
    item: u8,
    qty: i64,
    delivery_attempt: u32,
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![4 => Just(Outcome::Ok), 1 => Just(Outcome::Fail), 2 => Just(Outcome::Info)]
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![6 => Just(Fate::Applied), 1 => Just(Fate::Pending), 1 => Just(Fate::DeadLetter), 2 => Just(Fate::Absent)]
}

fn plan() -> impl Strategy<Value = Plan> {
    (prop::collection::vec(outcome(), 1..4), fate(), 0u8..4, 1i64..10, 1u32..5).prop_map(
        |(mut attempts, fate, item, qty, delivery_attempt)| {
            // A client stops retrying at its first ok.
            if let Some(i) = attempts.iter().position(|o| *o == Outcome::Ok) {
                attempts.truncate(i + 1);
            }
            Plan { attempts, fate, item, qty, delivery_attempt }
        },
    )
}

/// A generated run: the history and final state as data, plus what each order is.
#[derive(Debug, Clone)]
struct Run {
    history: Vec<Op>,
    final_state: Vec<FinalLine>,
    acknowledged: Vec<String>,
    failed: Vec<String>,
    applied: Vec<String>,
}

fn order_id(i: usize) -> String {
    format!("o{i}")
}

fn event_id(i: usize) -> String {
    format!("e{i}")
}

fn build(mut plans: Vec<Plan>, clients: usize, schedule: Vec<usize>) -> Run {
    add_anchor_orders(&mut plans);
    let history = history(&plans, clients, &schedule);
    settle(&plans, history)
}

/// Every run holds at least one applied acknowledged order and one failed
/// order, so that each injection has something to act on.
fn add_anchor_orders(plans: &mut Vec<Plan>) {
    plans.push(Plan {
        attempts: vec![Outcome::Info, Outcome::Ok],
        fate: Fate::Applied,
        item: 0,
        qty: 3,
        delivery_attempt: 2,
    });
    plans.push(Plan {
        attempts: vec![Outcome::Fail, Outcome::Fail],
        fate: Fate::Absent,
        item: 1,
        qty: 1,
        delivery_attempt: 1,
    });
}

/// A client thread: it does its orders in turn, attempt after attempt.
struct Thread {
    process: u64,
    /// Its next order, as a position in its queue.
    order: usize,
    /// The next attempt at that order.
    attempt: usize,
    /// Whether that attempt is invoked and waits for its completion.
    invoked: bool,
}

impl Thread {
    /// The thread's next op on order `i`: the invoke of its next attempt, or
    /// the completion of the one invoked.
    fn next_op(&mut self, i: usize, plan: &Plan) -> (OpType, OrderValue) {
        let value =
            OrderValue { order_id: order_id(i), item_id: format!("item-{}", plan.item), qty: plan.qty, event_id: None };
        if !self.invoked {
            self.invoked = true;
            return (OpType::Invoke, value);
        }
        self.invoked = false;
        let outcome = plan.attempts[self.attempt];
        self.attempt += 1;
        if self.attempt == plan.attempts.len() {
            self.order += 1;
            self.attempt = 0;
        }
        match outcome {
            Outcome::Ok => (OpType::Ok, OrderValue { event_id: Some(event_id(i)), ..value }),
            Outcome::Fail => (OpType::Fail, value),
            Outcome::Info => (OpType::Info, value),
        }
    }
}

/// The history of `plans` done by `clients` threads, interleaved as
/// `schedule` picks them, an op every millisecond.
fn history(plans: &[Plan], clients: usize, schedule: &[usize]) -> Vec<Op> {
    // Orders are dealt to client threads; each thread does its orders in turn,
    // attempt after attempt, and takes a new process number after an info.
    let mut queues: Vec<Vec<usize>> = vec![Vec::new(); clients];
    for i in 0..plans.len() {
        queues[i % clients].push(i);
    }
    let mut threads: Vec<Thread> =
        (0..clients).map(|t| Thread { process: t as u64, order: 0, attempt: 0, invoked: false }).collect();
    let mut next_process = clients as u64;
    let mut history = Vec::new();
    let mut time_ns = 0u64;
    let mut step = 0usize;
    loop {
        let live: Vec<usize> = (0..clients).filter(|&t| threads[t].order < queues[t].len()).collect();
        if live.is_empty() {
            break;
        }
        let t = live[schedule.get(step).copied().unwrap_or(step) % live.len()];
        step += 1;
        time_ns += 1_000_000;
        let th = &mut threads[t];
        let i = queues[t][th.order];
        let (kind, value) = th.next_op(i, &plans[i]);
        history.push(Op {
            index: history.len() as u64,
            time_ns,
            process: Process::Client(th.process),
            kind,
            f: "order".into(),
            value: OpValue::Order(value),
            correlation_id: None,
            error: None,
        });
        if kind == OpType::Info {
            th.process = next_process;
            next_process += 1;
        }
    }
    history
}

/// The run of `history`: the final state that a correct system leaves for
/// `plans`, and what each order is.
fn settle(plans: &[Plan], history: Vec<Op>) -> Run {
    let end_ns = history.last().map_or(0, |op| op.time_ns);
    let mut run =
        Run { history, final_state: Vec::new(), acknowledged: Vec::new(), failed: Vec::new(), applied: Vec::new() };
    let mut projection: BTreeMap<String, i64> = BTreeMap::new();
    for (i, plan) in plans.iter().enumerate() {
        settle_order(&mut run, &mut projection, i, plan);
    }
    for (item_id, reserved_qty) in projection {
        run.final_state.push(FinalLine::Projection(ProjectionRow { item_id, reserved_qty }));
    }
    run.final_state.push(FinalLine::Meta(Meta {
        quiesced: true,
        read_at_ns: end_ns + 1,
        run_started_at_ms: 0,
        ledger: None,
        unlisted: None,
    }));
    run
}

/// Order `i`'s lines in the final state, and its effect on the `projection`.
fn settle_order(run: &mut Run, projection: &mut BTreeMap<String, i64>, i: usize, plan: &Plan) {
    let ok = plan.attempts.contains(&Outcome::Ok);
    let all_fail = plan.attempts.iter().all(|o| *o == Outcome::Fail);
    let item = format!("item-{}", plan.item);
    projection.entry(item.clone()).or_default();
    if all_fail {
        run.failed.push(order_id(i));
        return;
    }
    if ok {
        run.acknowledged.push(order_id(i));
    }
    let fate = if ok && plan.fate == Fate::Absent { Fate::Applied } else { plan.fate };
    if fate == Fate::Absent {
        return;
    }
    run.final_state.push(FinalLine::Order(OrderRow {
        order_id: order_id(i),
        item_id: item.clone(),
        qty: plan.qty,
        event_id: event_id(i),
        ..OrderRow::default()
    }));
    let message = || format!("m{i}");
    let line = match fate {
        Fate::Applied => {
            run.applied.push(order_id(i));
            *projection.get_mut(&item).unwrap() += plan.qty;
            FinalLine::Applied(Applied {
                event_id: event_id(i),
                order_id: order_id(i),
                item_id: item,
                qty: plan.qty,
                delivery_attempt: plan.delivery_attempt,
                worker_id: format!("w{}", i % 3),
                applied_at_ms: i as i64 * 3,
                key_seq: None,
                publish_seq: None,
            })
        }
        Fate::Pending => {
            FinalLine::Pending(Pending { message_id: message(), event_id: event_id(i), delivery_count: 1 })
        }
        Fate::DeadLetter => FinalLine::DeadLetter(DeadLetter {
            message_id: message(),
            event_id: event_id(i),
            delivery_count: 5,
            last_error: Some("poison".into()),
        }),
        Fate::Absent => unreachable!("handled above"),
    };
    run.final_state.push(line);
}

fn run_strategy() -> impl Strategy<Value = Run> {
    (prop::collection::vec(plan(), 0..40), 1usize..6, prop::collection::vec(0usize..8, 0..200))
        .prop_map(|(plans, clients, schedule)| build(plans, clients, schedule))
}

fn check(run: &Run) -> Results {
    let mut h = JsonlWriter::new(Vec::new());
    for op in &run.history {
        h.write(op).unwrap();
    }
    let mut f = JsonlWriter::new(Vec::new());
    for line in &run.final_state {
        f.write(line).unwrap();
    }
    check_readers(&h.into_inner()[..], Some(&f.into_inner()[..])).expect("generated runs follow the format")
}

/// The anomalies reported, by name, with the order ids (or item ids) they name.
fn reported(results: &Results) -> BTreeMap<String, Vec<String>> {
    results
        .failing_anomalies()
        .map(|(name, r)| {
            let subjects = r.examples.iter().map(|e| e.order_id.clone().or(e.item_id.clone()).unwrap()).collect();
            (name.to_owned(), subjects)
        })
        .collect()
}

fn item_of(run: &Run, order: &str) -> String {
    run.final_state
        .iter()
        .find_map(|l| match l {
            FinalLine::Order(o) if o.order_id == order => Some(o.item_id.clone()),
            _ => None,
        })
        .unwrap()
}

fn add_to_projection(run: &mut Run, item: &str, delta: i64) {
    for line in &mut run.final_state {
        if let FinalLine::Projection(p) = line
            && p.item_id == item
        {
            p.reserved_qty += delta;
            return;
        }
    }
    panic!("no projection line for {item}");
}

fn qty_of(run: &Run, order: &str) -> i64 {
    run.final_state
        .iter()
        .find_map(|l| match l {
            FinalLine::Order(o) if o.order_id == order => Some(o.qty),
            _ => None,
        })
        .unwrap()
}

fn expect(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<String>> {
    pairs.iter().map(|(a, s)| (a.to_string(), vec![s.to_string()])).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn valid_runs_pass(run in run_strategy()) {
        let results = check(&run);
        prop_assert_eq!(results.valid, Verdict::Valid, "{:?}", reported(&results));
        prop_assert_eq!(results.counts.acknowledged as usize, run.acknowledged.len());
        prop_assert_eq!(results.counts.failed as usize, run.failed.len());
    }

    /// The series lose nothing to their bounded buckets: every completed op
    /// and every application is in one.
    #[test]
    fn the_series_hold_every_op_and_application(run in run_strategy()) {
        let results = check(&run);
        let s = &results.series;
        let ops: u64 = s.ops.iter().flat_map(|b| [&b.ok, &b.fail, &b.info]).flatten().map(|o| o.count).sum();
        let completed = results.latency_ms.ops.values().map(|q| q.count).sum::<u64>();
        prop_assert_eq!(ops, completed);
        let has_meta = run.final_state.iter().any(|l| matches!(l, FinalLine::Meta(_)));
        match &s.applications {
            Some(apps) => prop_assert_eq!(apps.iter().map(|b| b.applied).sum::<u64>(), results.counts.applied_lines),
            None => prop_assert!(!has_meta),
        }
        prop_assert!(s.ops.windows(2).all(|w| w[0].start_ns < w[1].start_ns));
        prop_assert!(s.ops.iter().all(|b| b.start_ns % s.bucket_ns == 0 && b.start_ns <= s.history_end_ns));
    }

    #[test]
    fn lost_order_is_found(run in run_strategy(), pick in any::<prop::sample::Index>()) {
        let mut run = run;
        let candidates: Vec<String> = run.acknowledged.iter().filter(|o| run.applied.contains(o)).cloned().collect();
        let victim = pick.get(&candidates).clone();
        let (item, qty) = (item_of(&run, &victim), qty_of(&run, &victim));
        // A consistent loss, as a crash would leave it: the row and its effect gone.
        run.final_state.retain(|l| !matches!(l, FinalLine::Order(o) if o.order_id == victim) && !matches!(l, FinalLine::Applied(a) if a.order_id == victim));
        add_to_projection(&mut run, &item, -qty);
        let results = check(&run);
        prop_assert_eq!(results.valid, Verdict::Invalid);
        prop_assert_eq!(reported(&results), expect(&[("lost-order", &victim)]));
    }

    #[test]
    fn lost_effect_is_found(run in run_strategy(), pick in any::<prop::sample::Index>()) {
        let mut run = run;
        let victim = pick.get(&run.applied).clone();
        let (item, qty) = (item_of(&run, &victim), qty_of(&run, &victim));
        run.final_state.retain(|l| !matches!(l, FinalLine::Applied(a) if a.order_id == victim));
        add_to_projection(&mut run, &item, -qty);
        let results = check(&run);
        prop_assert_eq!(reported(&results), expect(&[("lost-effect", &victim), ("projection-mismatch", &item)]));
    }

    #[test]
    fn double_application_is_found(run in run_strategy(), pick in any::<prop::sample::Index>()) {
        let mut run = run;
        let victim = pick.get(&run.applied).clone();
        let (item, qty) = (item_of(&run, &victim), qty_of(&run, &victim));
        let mut again = run.final_state.iter().find_map(|l| match l {
            FinalLine::Applied(a) if a.order_id == victim => Some(a.clone()),
            _ => None,
        }).unwrap();
        again.delivery_attempt += 1;
        again.worker_id = "zombie".into();
        run.final_state.insert(0, FinalLine::Applied(again));
        add_to_projection(&mut run, &item, qty);
        let results = check(&run);
        prop_assert_eq!(reported(&results), expect(&[("double-applied", &victim), ("projection-mismatch", &item)]));
    }

    #[test]
    fn uninvoked_effect_is_found(run in run_strategy()) {
        let mut run = run;
        let item = item_of(&run, &run.applied[0].clone());
        run.final_state.insert(0, FinalLine::Order(OrderRow { order_id: "ghost".into(), item_id: item.clone(), qty: 4, event_id: "eg".into(), ..OrderRow::default() }));
        run.final_state.insert(0, FinalLine::Applied(Applied { event_id: "eg".into(), order_id: "ghost".into(), item_id: item.clone(), qty: 4, delivery_attempt: 1, worker_id: "w".into(), applied_at_ms: 1, key_seq: None, publish_seq: None }));
        add_to_projection(&mut run, &item, 4);
        let results = check(&run);
        prop_assert_eq!(reported(&results), expect(&[("unexpected-effect", "ghost")]));
    }

    #[test]
    fn failed_but_present_is_found(run in run_strategy(), pick in any::<prop::sample::Index>()) {
        let mut run = run;
        let victim = pick.get(&run.failed).clone();
        let invoke = run.history.iter().find_map(|op| op.order().filter(|o| o.order_id == victim).cloned()).unwrap();
        run.final_state.insert(0, FinalLine::Order(OrderRow { order_id: victim.clone(), item_id: invoke.item_id.clone(), qty: invoke.qty, event_id: "ef".into(), ..OrderRow::default() }));
        run.final_state.insert(0, FinalLine::Applied(Applied { event_id: "ef".into(), order_id: victim.clone(), item_id: invoke.item_id.clone(), qty: invoke.qty, delivery_attempt: 1, worker_id: "w".into(), applied_at_ms: 1, key_seq: None, publish_seq: None }));
        add_to_projection(&mut run, &invoke.item_id, invoke.qty);
        let results = check(&run);
        prop_assert_eq!(reported(&results), expect(&[("failed-but-present", &victim)]));
    }

    #[test]
    fn projection_drift_is_found(run in run_strategy(), delta in prop_oneof![-5i64..0, 1i64..5]) {
        let mut run = run;
        let item = item_of(&run, &run.applied[0].clone());
        add_to_projection(&mut run, &item, delta);
        let results = check(&run);
        prop_assert_eq!(reported(&results), expect(&[("projection-mismatch", &item)]));
    }
}
