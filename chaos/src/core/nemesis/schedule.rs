//! The seeded schedule of a run's faults.
//!
//! It fires every enabled fault once first, in a seeded order (the restarts,
//! slow to heal, last) and with calms and holds cut to fit the time limit
//! ([`check_fit`] says before a run whether they can), then picks faults at
//! random. A stop that fails leaves
//! its fault active and is retried until it takes effect.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use haunt_store::Rng;
use serde_json::json;
use tokio::time::Instant;

use super::script::PlannedWindow;
use crate::core::history::Recorder;
use crate::core::roles::Nemesis;
pub use crate::core::system::FaultContext;

/// Time allowed for starting and stopping one fault, in [`check_fit`] and in
/// the first round's plan. Locally a signal, a proxy switch or an admin call
/// takes milliseconds, an aimed kill, pause or cut waits up to 0.4 s for a batch
/// ([`super::Aim`]), restarting a killed node a few; a PostgreSQL restart
/// (crash recovery) takes longer and borrows from the round's slack.
pub const ACT_ALLOWANCE: Duration = Duration::from_millis(500);

/// How long after its hold the fault in a failed stop's way stops itself: a
/// signal or a proxy switch at once, an admin call within its 2 s timeout, a
/// PostgreSQL restart within pg_ctl's ten tries (about 10 s).
const STOP_RETRY_MARGIN: Duration = Duration::from_secs(15);

/// The first wait between stop attempts, doubled after each failure up to
/// [`STOP_RETRY_WAIT_MAX`]: a resumed worker answers within milliseconds, and
/// each second of waiting is a second the fault stays on after its window.
pub(super) const STOP_RETRY_WAIT_MIN: Duration = Duration::from_millis(200);
pub(super) const STOP_RETRY_WAIT_MAX: Duration = Duration::from_secs(2);

/// The durations of a schedule, from `--nemesis-interval-s`: before each fault
/// a calm of half to one and a half intervals, then a hold as long (at least
/// the fault's own [`Nemesis::hold_min`]).
#[derive(Debug, Clone, Copy)]
struct Timing {
    interval: Duration,
}

impl Timing {
    fn calm_min(self) -> Duration {
        self.interval / 2
    }

    fn hold_floor(self, hold_min: Duration) -> Duration {
        hold_min.max(self.interval / 2)
    }

    fn hold_max(self, hold_min: Duration) -> Duration {
        hold_min.max(self.interval * 3 / 2)
    }

    /// The least one fault takes: its calm, its hold, its start and stop.
    fn cost_min(self, hold_min: Duration) -> Duration {
        self.calm_min() + self.hold_floor(hold_min) + ACT_ALLOWANCE
    }
}

/// Deals fault kinds, by their least cost, to `at_once` lanes: costliest
/// first, each to the lane with the least so far, so that the lanes' first
/// rounds are about as long. Returns indices into `costs`, ascending per lane.
fn deal(costs: &[Duration], at_once: usize) -> Vec<Vec<usize>> {
    let lanes = at_once.clamp(1, costs.len().max(1));
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(costs[i]));
    let mut out = vec![Vec::new(); lanes];
    let mut load = vec![Duration::ZERO; lanes];
    for i in order {
        let lane = (0..lanes).min_by_key(|&l| load[l]).unwrap_or(0);
        out[lane].push(i);
        load[lane] += costs[i];
    }
    for lane in &mut out {
        lane.sort_unstable();
    }
    out
}

/// The time the longest lane needs to fire each of its kinds once.
fn first_round_min(hold_mins: &[Duration], interval: Duration, at_once: usize) -> Duration {
    let timing = Timing { interval };
    let costs: Vec<Duration> = hold_mins.iter().map(|&h| timing.cost_min(h)).collect();
    deal(&costs, at_once).iter().map(|lane| lane.iter().map(|&i| costs[i]).sum()).max().unwrap_or_default()
}

/// Why a run's time limit cannot fire every enabled fault once, and what would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// The least time limit that fires every fault once.
    pub needed: Duration,
    /// The faults that fit the time limit: each of the given ones, in order,
    /// that still fits with those taken before it.
    pub fitting: Vec<String>,
}

/// Whether `time_limit` fits one round of every fault in `kinds` (name and
/// shortest hold): the calm before each, its hold and [`ACT_ALLOWANCE`], with
/// the kinds dealt among `at_once` schedules as [`run_schedule`] deals them.
pub fn check_fit(
    kinds: &[(&str, Duration)],
    interval: Duration,
    at_once: usize,
    time_limit: Duration,
) -> Result<(), Unfit> {
    let holds: Vec<Duration> = kinds.iter().map(|(_, h)| *h).collect();
    let needed = first_round_min(&holds, interval, at_once);
    if needed <= time_limit {
        return Ok(());
    }
    let mut fitting: Vec<(&str, Duration)> = Vec::new();
    for &kind in kinds {
        let mut with = fitting.clone();
        with.push(kind);
        let holds: Vec<Duration> = with.iter().map(|(_, h)| *h).collect();
        if first_round_min(&holds, interval, at_once) <= time_limit {
            fitting = with;
        }
    }
    Err(Unfit { needed, fitting: fitting.into_iter().map(|(n, _)| n.to_owned()).collect() })
}

/// Faults active now, for progress lines and `haunt_fault_active`. A fault
/// stays here until a stop of it has taken effect.
#[derive(Debug, Default)]
pub struct ActiveFaults {
    active: Mutex<Vec<(String, String)>>,
    metrics: Option<Arc<haunt_telemetry::metrics::HarnessMetrics>>,
}

impl ActiveFaults {
    pub fn with_metrics(metrics: Arc<haunt_telemetry::metrics::HarnessMetrics>) -> Self {
        ActiveFaults { active: Mutex::default(), metrics: Some(metrics) }
    }

    fn set(&self, fault: &str, target: &str, on: bool) {
        if let Some(m) = &self.metrics {
            let labels = haunt_telemetry::metrics::FaultLabels { fault: fault.to_owned(), target: target.to_owned() };
            m.fault_active.get_or_create(&labels).set(i64::from(on));
        }
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        active.retain(|(f, t)| !(f == fault && t == target));
        if on {
            active.push((fault.to_owned(), target.to_owned()));
        }
    }

    pub fn list(&self) -> Vec<(String, String)> {
        self.active.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Debug, Clone)]
pub struct ScheduleOptions {
    /// Mean time between the end of one fault and the start of the next.
    pub interval: Duration,
    pub seed: u64,
    /// No fault starts after this; one that is active is stopped by then.
    pub deadline: Instant,
    /// What the system says of itself as each fault strikes.
    pub context: Option<Arc<dyn FaultContext>>,
    /// Windows to strike as given (`haunt run --schedule`), instead of the
    /// seeded schedule.
    pub script: Option<Arc<Vec<PlannedWindow>>>,
}

/// How long a failed stop is retried: past the longest hold any fault of the
/// run can have, since the fault in its way (a pause of the worker whose admin
/// switch it must reach) ends by then, plus [`STOP_RETRY_MARGIN`] for that
/// fault's own stop.
pub fn stop_retry_for(nemeses: &[Box<dyn Nemesis>], interval: Duration) -> Duration {
    let timing = Timing { interval };
    nemeses.iter().map(|n| timing.hold_max(n.hold_min())).max().unwrap_or_default() + STOP_RETRY_MARGIN
}

/// How often each enabled fault started, in the order of the nemeses given to
/// [`run_schedule`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Coverage {
    pub fired: Vec<(String, u32)>,
    /// Every window that started, as struck, in order of start: the run's
    /// `schedule.json`, which `--schedule` replays.
    pub windows: Vec<PlannedWindow>,
}

impl Coverage {
    /// The enabled faults that never started.
    pub fn never_fired(&self) -> Vec<String> {
        self.fired.iter().filter(|(_, n)| *n == 0).map(|(f, _)| f.clone()).collect()
    }

    pub fn counts(&self) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for (f, n) in &self.fired {
            *out.entry(f.clone()).or_default() += n;
        }
        out
    }
}

/// Records one nemesis action as two ops (before and after), the value naming
/// the target and, after, the result: `ok`, or `error: …`.
async fn act(
    recorder: &Recorder,
    f: &str,
    target: &str,
    action: impl Future<Output = anyhow::Result<()>>,
    aim: impl FnOnce() -> Option<serde_json::Value>,
) -> bool {
    act_in(recorder, f, target, None, action, aim).await.0
}

/// [`act`], with `context` added to the value of the op before.
async fn act_in(
    recorder: &Recorder,
    f: &str,
    target: &str,
    context: Option<serde_json::Map<String, serde_json::Value>>,
    action: impl Future<Output = anyhow::Result<()>>,
    aim: impl FnOnce() -> Option<serde_json::Value>,
) -> (bool, Option<serde_json::Value>) {
    let mut before = json!({"target": target});
    for (k, v) in context.into_iter().flatten() {
        before[k] = v;
    }
    recorder.nemesis(f, before);
    let result = action.await;
    let (ok, outcome) = match &result {
        Ok(()) => (true, "ok".to_owned()),
        Err(e) => (false, format!("error: {e:#}")),
    };
    if !ok {
        tracing::warn!(f, target, %outcome, "nemesis action failed");
    }
    let mut value = json!({"target": target, "result": outcome});
    let aim = aim();
    if let Some(aim) = &aim {
        value["aim"] = aim.clone();
    }
    recorder.nemesis(f, value);
    (ok, aim)
}

/// Stops a fault, again and again until a stop takes effect, `retry_for` has
/// passed, or `stop` is set. Every attempt is recorded; the fault stays in
/// `active` until one succeeds. True if it was healed.
pub(super) async fn stop_until_healed(
    nemesis: &dyn Nemesis,
    target: &str,
    recorder: &Recorder,
    active: &ActiveFaults,
    retry_for: Duration,
    stop: &AtomicBool,
) -> bool {
    let give_up_at = Instant::now() + retry_for;
    let mut wait = STOP_RETRY_WAIT_MIN;
    loop {
        if act(recorder, &haunt_format::fault_ops(nemesis.family()).1, target, nemesis.stop(), || None).await {
            active.set(nemesis.name(), target, false);
            return true;
        }
        if stop.load(Ordering::Relaxed) || Instant::now() + wait > give_up_at {
            return false;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(STOP_RETRY_WAIT_MAX);
    }
}

/// Sleeps until `at` unless stopped first; true if it slept the whole way.
pub(super) async fn sleep_until(at: Instant, stop: &AtomicBool) -> bool {
    // Checks the stop flag every 50 ms: Ctrl-C must not wait out a long hold.
    while Instant::now() < at {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        tokio::time::sleep((at - Instant::now()).min(Duration::from_millis(50))).await;
    }
    !stop.load(Ordering::Relaxed)
}

/// Runs faults from a seeded schedule until the deadline or `stop`: first every
/// fault once, in a seeded order, with calms and holds cut so that the round
/// fits before the deadline (when [`check_fit`] passed), then faults picked at
/// random. Returns how often each started.
///
/// With `at_once` above one, that many schedules run side by side, each over
/// its share of the fault kinds (dealt by [`deal`]), so faults of different
/// kinds overlap: a pause during database errors, say. A kind is never active
/// twice at once. A fault whose stop never took effect is left in `active`
/// for [`super::heal_all`], and its schedule starts nothing more.
pub async fn run_schedule(
    nemeses: &[Box<dyn Nemesis>],
    recorder: &Recorder,
    active: &ActiveFaults,
    options: ScheduleOptions,
    at_once: usize,
    stop: &AtomicBool,
) -> Coverage {
    let retry_for = stop_retry_for(nemeses, options.interval);
    let struck = Struck { recorder, active, started: Instant::now(), retry_for, stop, windows: Mutex::default() };
    if let Some(script) = options.script.clone() {
        return super::script::replay(nemeses, &script, &struck, &options).await;
    }
    let timing = Timing { interval: options.interval };
    let usable: Vec<usize> = (0..nemeses.len()).filter(|&i| !nemeses[i].targets().is_empty()).collect();
    let costs: Vec<Duration> = usable.iter().map(|&i| timing.cost_min(nemeses[i].hold_min())).collect();
    let struck = &struck;
    let schedules = deal(&costs, at_once).into_iter().enumerate().map(|(lane, share)| {
        let share: Vec<usize> = share.into_iter().map(|k| usable[k]).collect();
        let options = ScheduleOptions { seed: crate::core::seed::lane(options.seed, lane), ..options.clone() };
        async move {
            let kinds: Vec<&dyn Nemesis> = share.iter().map(|&i| nemeses[i].as_ref()).collect();
            let fired = one_schedule(&kinds, lane, struck, options).await;
            share.into_iter().zip(fired).collect::<Vec<_>>()
        }
    });
    let mut fired = vec![0u32; nemeses.len()];
    for (i, n) in futures_util::future::join_all(schedules).await.into_iter().flatten() {
        fired[i] = n;
    }
    struck.coverage(nemeses, fired)
}

/// What every lane of a schedule shares: where it records, what is active,
/// when the schedule started, how long a stop is retried, the stop flag,
/// and the windows struck so far.
pub(super) struct Struck<'a> {
    pub recorder: &'a Recorder,
    pub active: &'a ActiveFaults,
    pub started: Instant,
    pub retry_for: Duration,
    pub stop: &'a AtomicBool,
    pub windows: Mutex<Vec<PlannedWindow>>,
}

impl Struck<'_> {
    /// One window: `nemesis` starts on `target` (its start op carrying what
    /// the system tells of itself), holds for `hold`, and is stopped until
    /// healed. Returns whether it started, and whether it healed (a lane
    /// whose fault never healed starts nothing more).
    pub async fn strike(
        &self,
        nemesis: &dyn Nemesis,
        target: &str,
        hold: Duration,
        lane: usize,
        context: Option<&Arc<dyn FaultContext>>,
    ) -> (bool, bool) {
        let (start_f, _) = haunt_format::fault_ops(nemesis.family());
        self.active.set(nemesis.name(), target, true);
        let context = match context {
            Some(c) => c.at_fault().await,
            None => None,
        };
        let at = Instant::now();
        let (started, aim) =
            act_in(self.recorder, &start_f, target, context, nemesis.start(target), || nemesis.take_aim()).await;
        if started {
            let window = PlannedWindow {
                lane,
                fault: nemesis.name().to_owned(),
                target: target.to_owned(),
                start_ms: millis(at - self.started),
                hold_ms: millis(hold),
                aim,
            };
            self.windows.lock().unwrap_or_else(|p| p.into_inner()).push(window);
        }
        sleep_until(Instant::now() + hold, self.stop).await;
        let healed = stop_until_healed(nemesis, target, self.recorder, self.active, self.retry_for, self.stop).await;
        if !healed && !self.stop.load(Ordering::Relaxed) {
            tracing::warn!(fault = nemesis.name(), %target, retry_for = ?self.retry_for, "the fault's stop never took effect");
        }
        (started, healed)
    }

    /// How often each of `nemeses` fired, and the windows in order of start.
    pub fn coverage(&self, nemeses: &[Box<dyn Nemesis>], fired: Vec<u32>) -> Coverage {
        let mut windows = std::mem::take(&mut *self.windows.lock().unwrap_or_else(|p| p.into_inner()));
        windows.sort_by_key(|w| (w.start_ms, w.lane));
        Coverage { fired: nemeses.iter().zip(fired).map(|(n, c)| (n.name().to_owned(), c)).collect(), windows }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One lane of [`run_schedule`]. Returns how often each of `kinds` started.
async fn one_schedule(kinds: &[&dyn Nemesis], lane: usize, struck: &Struck<'_>, options: ScheduleOptions) -> Vec<u32> {
    let stop = struck.stop;
    let mut fired = vec![0u32; kinds.len()];
    if kinds.is_empty() {
        return fired;
    }
    let timing = Timing { interval: options.interval };
    let spread_ms = options.interval.as_millis().max(1) as u64;
    let mut rng = Rng::new(options.seed);
    // The first round, popped from the end: every kind once, in a seeded
    // order, but the faults slow to heal last (at the front), so that a
    // restart that takes longer than planned cannot crowd out the others:
    // a Kafka broker's restart under the suite's load left a kill no room
    // in 24 s (2026-12-05).
    let mut first_round: Vec<usize> = (0..kinds.len()).collect();
    for i in (1..first_round.len()).rev() {
        first_round.swap(i, rng.below(i as u64 + 1) as usize);
    }
    first_round.sort_by_key(|&k| !kinds[k].slow_to_heal());
    loop {
        let in_first_round = !first_round.is_empty();
        let k = first_round.pop().unwrap_or_else(|| rng.below(kinds.len() as u64) as usize);
        let nemesis = kinds[k];
        let mut calm_extra = Duration::from_millis(rng.below(spread_ms));
        let mut hold_extra = Duration::from_millis(rng.below(spread_ms));
        if in_first_round {
            // What the rest of the round needs at least stays free; of the time
            // left over, this fault's random part takes at most its share.
            let rest: Duration = first_round.iter().map(|&r| timing.cost_min(kinds[r].hold_min())).sum();
            let left = options.deadline.saturating_duration_since(Instant::now());
            let slack = left.saturating_sub(rest + timing.cost_min(nemesis.hold_min()));
            let share = slack / (first_round.len() as u32 + 1);
            let extra = calm_extra + hold_extra;
            if extra > share {
                let scale = share.as_secs_f64() / extra.as_secs_f64();
                calm_extra = calm_extra.mul_f64(scale);
                hold_extra = hold_extra.mul_f64(scale);
            }
        }
        let calm = timing.calm_min() + calm_extra;
        let hold = nemesis.hold_min().max(options.interval / 2 + hold_extra);
        if Instant::now() + calm + hold > options.deadline {
            // A shorter fault of the first round may still fit; after it, the
            // run is over for this schedule.
            if in_first_round {
                continue;
            }
            break;
        }
        if !sleep_until(Instant::now() + calm, stop).await {
            break;
        }
        let targets = nemesis.targets();
        let target = targets[rng.below(targets.len() as u64) as usize].clone();
        let (started, healed) = struck.strike(nemesis, &target, hold, lane, options.context.as_ref()).await;
        fired[k] += u32::from(started);
        if !healed {
            break;
        }
    }
    fired
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::core::fault::Fault;
    use crate::core::nemesis::heal_all;
    use crate::core::roles::{BoxFuture, HOLD_MIN_DEFAULT};

    /// A fault that only counts. Its stop fails `stop_failures` times before
    /// it takes effect, and notes at each attempt whether the fault was still
    /// listed as active. Starting and stopping take `act` (of tokio's clock).
    struct Fake {
        name: &'static str,
        hold_min: Duration,
        act: Duration,
        stop_failures: AtomicU32,
        active: Arc<ActiveFaults>,
        /// Each stop attempt: when, whether the fault was listed as active.
        stops: Arc<Mutex<Vec<(Instant, bool)>>>,
        slow_to_heal: bool,
    }

    impl Fake {
        fn new(name: &'static str, hold_min: Duration, active: &Arc<ActiveFaults>) -> Fake {
            Fake {
                name,
                hold_min,
                act: Duration::ZERO,
                stop_failures: AtomicU32::new(0),
                active: active.clone(),
                stops: Arc::default(),
                slow_to_heal: false,
            }
        }
    }

    impl Nemesis for Fake {
        fn name(&self) -> &'static str {
            self.name
        }
        fn family(&self) -> &'static str {
            "fake"
        }
        fn targets(&self) -> Vec<String> {
            vec!["t".into()]
        }
        fn hold_min(&self) -> Duration {
            self.hold_min
        }
        fn slow_to_heal(&self) -> bool {
            self.slow_to_heal
        }
        fn start<'a>(&'a self, _target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move {
                tokio::time::sleep(self.act).await;
                Ok(())
            })
        }
        fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
            Box::pin(async move {
                tokio::time::sleep(self.act).await;
                let listed = self.active.list().iter().any(|(f, t)| f == self.name && t == "t");
                self.stops.lock().unwrap().push((Instant::now(), listed));
                let left = self.stop_failures.load(Ordering::Relaxed);
                if left > 0 {
                    self.stop_failures.store(left - 1, Ordering::Relaxed);
                    anyhow::bail!("timed out");
                }
                Ok(())
            })
        }
    }

    fn fakes(list: Vec<Fake>) -> Vec<Box<dyn Nemesis>> {
        list.into_iter().map(|f| Box::new(f) as Box<dyn Nemesis>).collect()
    }

    fn history(dir: &tempfile::TempDir) -> Vec<haunt_format::Op> {
        let text = std::fs::read_to_string(dir.path().join("h.jsonl")).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn result_of(op: &haunt_format::Op) -> Option<String> {
        match &op.value {
            haunt_format::OpValue::Other(v) => v.get("result").and_then(|r| r.as_str()).map(str::to_owned),
            _ => None,
        }
    }

    /// A seeded schedule's windows, struck again as a script, come back the
    /// same: the same faults on the same targets in the same lanes, in the
    /// same order, each at its start (in paused time, to the millisecond),
    /// and none after the deadline.
    #[tokio::test]
    async fn a_schedule_struck_again_from_its_windows_repeats_them() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
        let active = Arc::new(ActiveFaults::default());
        let make = || {
            fakes(vec![
                Fake::new("a", HOLD_MIN_DEFAULT, &active),
                Fake::new("b", HOLD_MIN_DEFAULT, &active),
                Fake::new("c", HOLD_MIN_DEFAULT, &active),
            ])
        };
        let options = |script: Option<Vec<PlannedWindow>>| ScheduleOptions {
            interval: Duration::from_secs(1),
            seed: 5,
            deadline: Instant::now() + Duration::from_secs(20),
            context: None,
            script: script.map(Arc::new),
        };
        let never = AtomicBool::new(false);
        let seeded = run_schedule(&make(), &recorder, &active, options(None), 2, &never).await;
        assert!(seeded.windows.len() >= 6, "{:?}", seeded.windows);
        assert!(seeded.windows.iter().any(|w| w.lane == 1), "two lanes: {:?}", seeded.windows);
        crate::core::nemesis::script::check(&seeded.windows, &make()).unwrap();
        let again = run_schedule(&make(), &recorder, &active, options(Some(seeded.windows.clone())), 1, &never).await;
        let shape = |ws: &[PlannedWindow]| -> Vec<(usize, String, String, u64)> {
            ws.iter().map(|w| (w.lane, w.fault.clone(), w.target.clone(), w.hold_ms)).collect()
        };
        assert_eq!(shape(&again.windows), shape(&seeded.windows));
        for (a, b) in again.windows.iter().zip(&seeded.windows) {
            assert!(a.start_ms.abs_diff(b.start_ms) <= 5, "{a:?} against {b:?}");
        }
        assert_eq!(again.fired, seeded.fired);

        // A window past the deadline is not struck; one naming another fault
        // or a target the fault cannot hit is refused before anything starts.
        let mut late = seeded.windows[0].clone();
        late.start_ms = 60_000;
        let cut = run_schedule(&make(), &recorder, &active, options(Some(vec![late.clone()])), 1, &never).await;
        assert!(cut.windows.is_empty(), "{:?}", cut.windows);
        let other = PlannedWindow { fault: "d".into(), ..late.clone() };
        let err = crate::core::nemesis::script::check(&[other], &make()).unwrap_err().to_string();
        assert!(err.contains("windows[0].fault d"), "{err}");
        let elsewhere = PlannedWindow { target: "u".into(), ..late };
        let err = crate::core::nemesis::script::check(&[elsewhere], &make()).unwrap_err().to_string();
        assert!(err.contains("windows[0].target u"), "{err}");
    }

    /// A cluster whose node 2 leads both partitions.
    #[derive(Debug)]
    struct Leaders;

    impl FaultContext for Leaders {
        fn at_fault(&self) -> crate::core::roles::BoxFuture<'_, Option<serde_json::Map<String, serde_json::Value>>> {
            Box::pin(async { json!({"leaders": {"broker-2": [0, 1]}}).as_object().cloned() })
        }
    }

    /// Whatever the seed, the first round strikes a fault slow to heal (a
    /// restart) after every other kind, and the rest in a seeded order.
    #[tokio::test]
    async fn the_first_round_strikes_the_faults_slow_to_heal_last() {
        tokio::time::pause();
        let mut orders = std::collections::BTreeSet::new();
        for seed in 1..=12 {
            let dir = tempfile::tempdir().unwrap();
            let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
            let active = Arc::new(ActiveFaults::default());
            let mut restart = Fake::new("broker-restart", HOLD_MIN_DEFAULT, &active);
            restart.slow_to_heal = true;
            let mut list = vec![restart];
            list.extend(["kill", "partition", "ack-loss"].map(|n| Fake::new(n, HOLD_MIN_DEFAULT, &active)));
            let nemeses = fakes(list);
            let options = ScheduleOptions {
                interval: Duration::from_secs(1),
                seed,
                deadline: Instant::now() + Duration::from_secs(30),
                context: None,
                script: None,
            };
            let coverage = run_schedule(&nemeses, &recorder, &active, options, 1, &AtomicBool::new(false)).await;
            let first: Vec<&str> = coverage.windows.iter().take(4).map(|w| w.fault.as_str()).collect();
            assert_eq!(first[3], "broker-restart", "seed {seed}: {first:?}");
            orders.insert(first[..3].join(","));
        }
        assert!(orders.len() > 1, "the others still come in a seeded order: {orders:?}");
    }

    #[tokio::test]
    async fn a_failed_stop_stays_active_and_is_retried_until_it_takes_effect() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
        let active = Arc::new(ActiveFaults::default());
        let f = Fake::new("db-error", HOLD_MIN_DEFAULT, &active);
        f.stop_failures.store(3, Ordering::Relaxed);
        let stops = f.stops.clone();
        let nemeses = fakes(vec![f]);
        // Room for one fault only: 1 s calm and hold at most, then the deadline.
        let options = ScheduleOptions {
            interval: Duration::from_secs(1),
            seed: 1,
            deadline: Instant::now() + Duration::from_secs(4),
            context: Some(Arc::new(Leaders)),
            script: None,
        };
        let coverage = run_schedule(&nemeses, &recorder, &active, options, 1, &AtomicBool::new(false)).await;
        recorder.finish().unwrap();
        assert_eq!(coverage.fired, vec![("db-error".to_owned(), 1)]);
        // The system's word as the fault struck is in the start op before the
        // strike, and only there.
        let starts: Vec<serde_json::Value> = history(&dir)
            .iter()
            .filter(|op| op.f == "start-fake")
            .map(|op| serde_json::to_value(&op.value).unwrap())
            .collect();
        assert_eq!(starts.len(), 2);
        assert_eq!(starts[0]["leaders"], json!({"broker-2": [0, 1]}), "{starts:?}");
        assert!(starts[1].get("leaders").is_none(), "{starts:?}");
        let stops = stops.lock().unwrap().clone();
        assert_eq!(stops.len(), 4, "three failed attempts, then the one that took effect");
        assert!(stops.iter().all(|(_, listed)| *listed), "active until a stop took effect: {stops:?}");
        assert!(active.list().is_empty(), "healed at last");
        let waits: Vec<Duration> = stops.windows(2).map(|w| w[1].0 - w[0].0).collect();
        // The timer rounds each sleep up to its next millisecond tick or two.
        let backoff = [200, 400, 800].map(Duration::from_millis);
        assert!(waits.iter().zip(backoff).all(|(w, b)| *w >= b && *w < b + Duration::from_millis(5)), "{waits:?}");
        // In the history: each attempt is two ops, the failed ones say so, the last is ok.
        let results: Vec<Option<String>> =
            history(&dir).iter().filter(|op| op.f == "stop-fake").map(result_of).collect();
        assert_eq!(results.len(), 8);
        assert!(results.iter().step_by(2).all(Option::is_none), "before ops carry no result");
        let afters: Vec<&str> = results.iter().skip(1).step_by(2).map(|r| r.as_deref().unwrap()).collect();
        assert_eq!(afters, ["error: timed out", "error: timed out", "error: timed out", "ok"]);
    }

    #[tokio::test]
    async fn a_stop_that_never_takes_effect_is_retried_within_its_bound_and_left_to_heal_all() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
        let active = Arc::new(ActiveFaults::default());
        let f = Fake::new("db-error", HOLD_MIN_DEFAULT, &active);
        f.stop_failures.store(u32::MAX, Ordering::Relaxed);
        let stops = f.stops.clone();
        let nemeses = fakes(vec![f]);
        let interval = Duration::from_secs(1);
        let options = ScheduleOptions {
            interval,
            seed: 1,
            deadline: Instant::now() + Duration::from_secs(60),
            context: None,
            script: None,
        };
        run_schedule(&nemeses, &recorder, &active, options, 1, &AtomicBool::new(false)).await;
        let retry_for = stop_retry_for(&nemeses, interval);
        assert_eq!(retry_for, Duration::from_millis(1500) + STOP_RETRY_MARGIN);
        let stops = stops.lock().unwrap().clone();
        let (first, last) = (stops[0].0, stops[stops.len() - 1].0);
        assert!(last - first <= retry_for && last - first >= retry_for - STOP_RETRY_WAIT_MAX, "{:?}", last - first);
        assert_eq!(active.list(), vec![("db-error".to_owned(), "t".to_owned())], "still active: it never healed");
        // The schedule gave up on it and started nothing more: one start only.
        recorder.flush().unwrap();
        let starts = history(&dir).iter().filter(|op| op.f == "start-fake").count();
        assert_eq!(starts, 2);
        let err = heal_all(&nemeses, &recorder, &active, retry_for).await.unwrap_err();
        assert!(format!("{err:#}").contains("could not heal: db-error on t"), "{err:#}");
        assert_eq!(active.list().len(), 1);
    }

    fn hold(name: &str, visibility_timeout: Duration) -> Duration {
        Fault::from_name(name).expect("a fault's name").hold_min(visibility_timeout)
    }

    /// The seven local faults as fakes: holds as `haunt run` gives them, each
    /// start and stop taking `act`.
    const LOCAL_DEFAULTS: [&str; 7] = ["kill", "pause", "partition", "delay", "ack-loss", "clock-skew", "db-error"];

    fn seven_local_faults(active: &Arc<ActiveFaults>, visibility_timeout: Duration, act: Duration) -> Vec<Fake> {
        LOCAL_DEFAULTS
            .into_iter()
            .map(|name| Fake { act, ..Fake::new(name, hold(name, visibility_timeout), active) })
            .collect()
    }

    #[tokio::test]
    async fn with_the_default_options_every_local_fault_fires_whatever_the_seed() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        // haunt run's defaults: 60 s, --nemesis-interval-s 5, --visibility-timeout-ms 2000.
        let (limit, interval, vt) = (Duration::from_secs(60), Duration::from_secs(5), Duration::from_secs(2));
        let kinds: Vec<(&str, Duration)> = LOCAL_DEFAULTS.iter().map(|&n| (n, hold(n, vt))).collect();
        assert_eq!(check_fit(&kinds, interval, 1, limit), Ok(()));
        for at_once in [1, 2, 3] {
            for seed in 0..40 {
                let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
                let active = Arc::new(ActiveFaults::default());
                let nemeses = fakes(seven_local_faults(&active, vt, Duration::from_millis(50)));
                let options =
                    ScheduleOptions { interval, seed, deadline: Instant::now() + limit, context: None, script: None };
                let coverage =
                    run_schedule(&nemeses, &recorder, &active, options, at_once, &AtomicBool::new(false)).await;
                assert_eq!(coverage.never_fired(), Vec::<String>::new(), "seed {seed}, {at_once} at once");
                assert!(active.list().is_empty());
            }
        }
    }

    #[tokio::test]
    async fn a_time_limit_that_just_fits_fires_every_fault() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        let (interval, vt) = (Duration::from_secs(1), Duration::from_millis(500));
        let kinds: Vec<(&str, Duration)> = LOCAL_DEFAULTS.iter().map(|&n| (n, hold(n, vt))).collect();
        // Seven faults of 0.5 s calm, 0.5 s hold (pause 1 s) and 0.5 s to act.
        let needed = Duration::from_millis(7 * 1500 + 500);
        assert_eq!(check_fit(&kinds, interval, 1, needed), Ok(()));
        let unfit = check_fit(&kinds, interval, 1, needed - Duration::from_millis(1)).unwrap_err();
        assert_eq!(unfit.needed, needed);
        assert_eq!(unfit.fitting, ["kill", "pause", "partition", "delay", "ack-loss", "clock-skew"]);
        // Two schedules: pause and two others in one (5 s), four in the other (6 s).
        assert_eq!(check_fit(&kinds, interval, 2, Duration::from_secs(6)), Ok(()));
        for seed in 0..40 {
            let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
            let active = Arc::new(ActiveFaults::default());
            let nemeses = fakes(seven_local_faults(&active, vt, Duration::from_millis(100)));
            let options =
                ScheduleOptions { interval, seed, deadline: Instant::now() + needed, context: None, script: None };
            let coverage = run_schedule(&nemeses, &recorder, &active, options, 1, &AtomicBool::new(false)).await;
            assert_eq!(coverage.never_fired(), Vec::<String>::new(), "seed {seed}");
        }
    }
}
