//! `haunt shrink DIR`: from a failing run toward the smallest run that
//! still fails the same way.
//!
//! A candidate is the run's options with fewer fault windows, shorter holds,
//! a shorter time limit or fewer clients; it **still fails** when one of a
//! few reruns (real processes are not deterministic) shows one of the
//! anomaly kinds the run showed (`unknown`, a queue that never drained,
//! counts as a kind of its own). The search, in order:
//!
//! 1. cut the time limit a little after the first anomalous op, and the
//!    windows that start after it;
//! 2. ddmin over the windows ([`ddmin`]);
//! 3. halve each window's hold;
//! 4. end the run a little after the last window, and halve the clients.
//!
//! Every step keeps what still fails, within a budget of wall time. What it
//! ends with goes to `DIR/shrunk/`: `schedule.json`, `options.json` (the run
//! to replay with `haunt run --options`), `shrink.json` (every candidate and
//! its reruns) and `run` (the last failing rerun's directory).

pub mod ddmin;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::core::nemesis::{PlannedWindow, SCHEDULE_FILE, ScheduleFile};
use crate::core::options::RunOptions;
use crate::core::roles::BoxFuture;
use crate::suites::matrix::child::child_run;

/// `haunt shrink`'s options.
#[derive(Debug, Clone)]
pub struct ShrinkOptions {
    /// The failing run's directory.
    pub dir: PathBuf,
    /// Reruns of a candidate before it is said to pass.
    pub reruns: u32,
    /// Wall time for the search (the confirmation after it is not counted).
    pub budget: Duration,
    /// Reruns of the result, for its reproduction rate (0: none).
    pub confirm: u32,
    /// The `haunt` that runs each candidate.
    pub haunt: PathBuf,
    pub quiet: bool,
}

/// What a candidate changes of the run: its windows, its time limit, its clients.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub windows: Vec<PlannedWindow>,
    pub time_limit_s: u64,
    pub concurrency: usize,
}

impl Candidate {
    /// "1 window (ack-loss worker-2, 1.5 s), 8 s, 2 clients": what a summary says of it.
    pub fn describe(&self) -> String {
        let n = self.windows.len();
        let listed: Vec<String> = self
            .windows
            .iter()
            .take(3)
            .map(|w| format!("{} {}, {:.1} s", w.fault, w.target, w.hold_ms as f64 / 1000.0))
            .collect();
        let more = if n > 3 { ", …" } else { "" };
        let what = if n == 0 { String::new() } else { format!(" ({}{more})", listed.join("; ")) };
        let clients =
            if self.concurrency == 1 { "1 client".to_owned() } else { format!("{} clients", self.concurrency) };
        format!("{n} window{}{what}, {} s, {clients}", if n == 1 { "" } else { "s" }, self.time_limit_s)
    }
}

impl Candidate {
    /// The same windows, moved up: in each lane the first starts at 1 s and
    /// each next one 1 s after the one before it ends, in their order; the
    /// run ends 3 s after the last (at least 5 s in, and no later than it
    /// did).
    pub fn moved_up(mut self) -> Candidate {
        let mut lanes: std::collections::BTreeMap<usize, Vec<&mut PlannedWindow>> = Default::default();
        for w in &mut self.windows {
            lanes.entry(w.lane).or_default().push(w);
        }
        for lane in lanes.values_mut() {
            lane.sort_by_key(|w| w.start_ms);
            let mut at = 1_000;
            for w in lane.iter_mut() {
                w.start_ms = at;
                at += w.hold_ms + 1_000;
            }
        }
        self.windows.sort_by_key(|w| (w.start_ms, w.lane));
        let last_end = self.windows.iter().map(|w| w.start_ms + w.hold_ms).max().unwrap_or(0);
        self.time_limit_s = self.time_limit_s.min((last_end + 3_000).div_ceil(1000).max(5));
        self
    }
}

/// One rerun of a candidate.
#[derive(Debug, Clone, Serialize)]
pub struct Rerun {
    pub run_dir: Option<String>,
    /// The anomaly kinds it showed (`unknown` for a run that never drained).
    pub kinds: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One candidate tried, in `shrink.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub step: &'static str,
    pub candidate: Candidate,
    pub fails: bool,
    pub reruns: Vec<Rerun>,
}

/// `shrink.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub run: String,
    pub kinds: Vec<String>,
    pub before: Candidate,
    pub after: Candidate,
    /// Whether every step ran to its end within the budget.
    pub finished: bool,
    pub tries: usize,
    pub wall_s: f64,
    /// The result's failing reruns out of `confirm`, when confirmed.
    pub reproduced: Option<(u32, u32)>,
    /// The smaller results confirmed before this one and set aside, each
    /// having failed in none of its `confirm` reruns ([`walk_back`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub set_aside: Vec<SetAside>,
    pub replay: String,
    pub steps: Vec<Step>,
}

/// The anomaly kinds a run's results show, `unknown` for one that never drained.
pub fn kinds_of(results: &haunt_checker::Results) -> Vec<String> {
    let mut kinds: Vec<String> =
        results.anomalies.iter().filter(|(_, a)| a.count > 0).map(|(k, _)| k.clone()).collect();
    if results.valid == haunt_checker::Verdict::Unknown {
        kinds.push("unknown".into());
    }
    kinds
}

/// What the search asks of a candidate: whether it still fails, `None`
/// once the budget is spent. [`Trial`] answers with child runs.
pub trait Tries: Send {
    fn fails<'a>(&'a mut self, step: &'static str, c: &'a Candidate) -> BoxFuture<'a, Option<bool>>;
}

impl Tries for Trial<'_> {
    fn fails<'a>(&'a mut self, step: &'static str, c: &'a Candidate) -> BoxFuture<'a, Option<bool>> {
        Box::pin(self.try_candidate(step, c))
    }
}

/// Runs candidates as child runs of `haunt run --options`, each up to
/// `reruns` times, until the budget is spent.
struct Trial<'a> {
    options: &'a ShrinkOptions,
    base: RunOptions,
    kinds: Vec<String>,
    tries_dir: PathBuf,
    deadline: Instant,
    tries: usize,
    steps: Vec<Step>,
    last_failing: Option<String>,
    bar: Option<indicatif::ProgressBar>,
    best: String,
}

impl Trial<'_> {
    fn run_options(&self, c: &Candidate, seed: u64) -> RunOptions {
        let schedule = ScheduleFile::new(c.windows.clone());
        RunOptions {
            store: self.tries_dir.clone(),
            time_limit: Duration::from_secs(c.time_limit_s),
            concurrency: c.concurrency,
            faults: schedule.faults(),
            schedule: Some(schedule),
            seed,
            quiet: true,
            exe: self.options.haunt.clone(),
            ..self.base.clone()
        }
    }

    /// Whether `c` still fails; `None` once the budget is spent.
    async fn try_candidate(&mut self, step: &'static str, c: &Candidate) -> Option<bool> {
        let mut reruns = Vec::new();
        let mut fails = false;
        for i in 0..self.options.reruns.max(1) {
            if Instant::now() >= self.deadline {
                return None;
            }
            self.tick(step, c);
            // The first rerun keeps the run's seed; the others vary it.
            let seed = self.base.seed.wrapping_add(u64::from(i));
            let rerun = match child_run(&self.options.haunt, &self.run_options(c, seed), "shrink").await {
                Ok((dir, results)) => {
                    let kinds = kinds_of(&results);
                    Rerun { run_dir: Some(dir.display().to_string()), kinds, error: None }
                }
                Err(e) => Rerun { run_dir: None, kinds: Vec::new(), error: Some(e) },
            };
            let same = rerun.kinds.iter().any(|k| self.kinds.contains(k));
            if same {
                self.last_failing.clone_from(&rerun.run_dir);
            }
            reruns.push(rerun);
            if same {
                fails = true;
                break;
            }
        }
        self.tries += 1;
        if fails {
            self.best = c.describe();
        }
        self.steps.push(Step { step, candidate: c.clone(), fails, reruns });
        Some(fails)
    }

    fn tick(&self, step: &str, c: &Candidate) {
        if let Some(bar) = &self.bar {
            let left = self.deadline.saturating_duration_since(Instant::now()).as_secs();
            bar.set_message(format!(
                "{step}: trying {} | tries {} | best {} | {left} s left",
                c.describe(),
                self.tries,
                self.best
            ));
        }
    }
}

/// A result of the search set aside: it failed once in the search, then in
/// none of its confirmation's reruns.
#[derive(Debug, Clone, Serialize)]
pub struct SetAside {
    pub candidate: String,
    pub reproduced: (u32, u32),
}

/// How many earlier candidates [`walk_back`] confirms, at most, after the
/// search's result reproduced in none of its reruns.
pub const WALK_BACK_MAX: usize = 3;

/// The search accepts a candidate that fails in one of a few reruns, so a
/// rare failure (a flake of the system or of the machine) can carry it to a
/// result that does not reproduce. When `after` fails in none of its
/// confirmation's reruns, the candidates the search accepted before it are
/// confirmed in turn, the newest (smallest) first, at most
/// [`WALK_BACK_MAX`], and the first that fails again is the result.
/// Returns the result, its reproduction, and the ones set aside; `after`
/// itself, reported as it reproduced, when none of them fails either.
pub async fn walk_back<'a>(
    steps: &[Step],
    after: Candidate,
    mut confirm: impl FnMut(Candidate) -> BoxFuture<'a, Option<(u32, u32)>>,
) -> (Candidate, Option<(u32, u32)>, Vec<SetAside>) {
    let reproduced = confirm(after.clone()).await;
    let Some((0, n)) = reproduced else { return (after, reproduced, Vec::new()) };
    let mut set_aside = vec![SetAside { candidate: after.describe(), reproduced: (0, n) }];
    let mut earlier: Vec<&Candidate> = Vec::new();
    for step in steps.iter().rev().filter(|s| s.fails) {
        if step.candidate != after && !earlier.contains(&&step.candidate) {
            earlier.push(&step.candidate);
        }
    }
    for c in earlier.into_iter().take(WALK_BACK_MAX) {
        match confirm(c.clone()).await {
            Some((0, n)) => set_aside.push(SetAside { candidate: c.describe(), reproduced: (0, n) }),
            again => return (c.clone(), again, set_aside),
        }
    }
    (after, reproduced, set_aside.split_off(1))
}

/// Shrinks the failing run in `options.dir`; writes `DIR/shrunk/`.
pub fn shrink(options: &ShrinkOptions) -> futures_util::future::BoxFuture<'_, anyhow::Result<Report>> {
    // Boxed, as `crate::assemble::run_interruptible` says why.
    Box::pin(shrink_run(options))
}

async fn shrink_run(options: &ShrinkOptions) -> anyhow::Result<Report> {
    let dir = &options.dir;
    let run_file = read_json(&dir.join("run.json"))?;
    let base: RunOptions = serde_json::from_value(run_file["options"].clone())
        .with_context(|| format!("{}: options: not the options of a haunt run", dir.join("run.json").display()))?;
    let schedule = ScheduleFile::read(&dir.join(SCHEDULE_FILE))
        .with_context(|| format!("{} has no schedule to shrink (runs write one since 2026-12-05)", dir.display()))?;
    let results: haunt_checker::Results = serde_json::from_value(read_json(&dir.join("results.json"))?)
        .with_context(|| format!("{}: results.json", dir.display()))?;
    let kinds = kinds_of(&results);
    anyhow::ensure!(!kinds.is_empty(), "{}: the run was valid; there is nothing to shrink", dir.display());
    let out = dir.join("shrunk");
    // A second shrink of the same run replaces the first, tries and all,
    // rather than piling its runs on top.
    if out.exists() {
        if !options.quiet {
            eprintln!("replacing the last shrink's {}", out.display());
        }
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("tries")).with_context(|| format!("creating {}", out.display()))?;
    let started = Instant::now();
    let before = Candidate {
        windows: schedule.windows.clone(),
        time_limit_s: base.time_limit.as_secs().max(1),
        concurrency: base.concurrency,
    };
    let bar = (!options.quiet).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    });
    let mut trial = Trial {
        options,
        base,
        kinds: kinds.clone(),
        tries_dir: out.join("tries"),
        deadline: started + options.budget,
        tries: 0,
        steps: Vec::new(),
        last_failing: None,
        bar,
        best: before.describe(),
    };
    let first_anomaly_ms = results.anomalies.values().filter_map(|a| a.first_time_ns).min().map(|ns| ns / 1_000_000);
    let (after, finished) = search(&mut trial, before.clone(), first_anomaly_ms).await;
    let wall_s = started.elapsed().as_secs_f64();
    let steps = std::mem::take(&mut trial.steps);
    let (after, reproduced, set_aside) = {
        let trial = tokio::sync::Mutex::new(&mut trial);
        walk_back(&steps, after, |c| {
            let trial = &trial;
            Box::pin(async move {
                // One confirmation at a time: the walk awaits each before the next.
                let mut t = trial.lock().await;
                confirm(&mut t, &c).await
            })
        })
        .await
    };
    trial.steps = steps;
    let replay_options =
        RunOptions { store: out.join("replays"), quiet: false, ..trial.run_options(&after, trial.base.seed) };
    write_json(&out.join("options.json"), &replay_options)?;
    write_json(&out.join(SCHEDULE_FILE), &ScheduleFile::new(after.windows.clone()))?;
    let replay = format!("haunt run --options {}", out.join("options.json").display());
    if let Some(bar) = &trial.bar {
        bar.finish_and_clear();
    }
    if let Some(run) = &trial.last_failing {
        let link = out.join("run");
        let _ = std::fs::remove_file(&link);
        let _ = std::os::unix::fs::symlink(run, &link);
    }
    let report = Report {
        run: dir.display().to_string(),
        kinds,
        before,
        after,
        finished,
        tries: trial.tries,
        wall_s,
        reproduced,
        set_aside,
        replay,
        steps: trial.steps,
    };
    write_json(&out.join("shrink.json"), &report)?;
    Ok(report)
}

/// The steps of the search over `trial`, from `start` (which fails), the
/// first anomalous op `first_anomaly_ms` into the run. Returns the smallest
/// candidate that still failed, and whether every step ended within the
/// budget. [`shrink`] runs it over child runs; a test may run it over runs in
/// process.
pub async fn search<T: Tries>(trial: &mut T, start: Candidate, first_anomaly_ms: Option<u64>) -> (Candidate, bool) {
    let mut best = start;
    // 1. Cut after the first anomaly (2 s on, at least 5 s of run).
    if let Some(ms) = first_anomaly_ms {
        let limit = (ms + 2_000).div_ceil(1000).max(5);
        if limit < best.time_limit_s {
            let windows = best.windows.iter().filter(|w| w.start_ms < limit * 1000).cloned().collect();
            let cut = Candidate { windows, time_limit_s: limit, ..best.clone() };
            match trial.fails("cut after the first anomaly", &cut).await {
                Some(true) => best = cut,
                Some(false) => {}
                None => return (best, false),
            }
        }
    }
    // 2. ddmin over the windows, each subset tried early: its windows moved
    // up to the start of the run, one after another, and the run cut after
    // them. A window that struck at 50 s then costs a run of 10 s, not 60.
    if best.windows.len() >= 2 {
        let windows = best.windows.clone();
        let template = best.clone();
        let subset = |kept: &[usize]| {
            let windows = kept.iter().map(|&i| windows[i].clone()).collect();
            Candidate { windows, ..template.clone() }.moved_up()
        };
        // One candidate at a time: the lock is never contended, it only lets
        // each try's future borrow the trial, for as long as the search runs.
        let found = {
            let cell = tokio::sync::Mutex::new(&mut *trial);
            ddmin::ddmin(windows.len(), |kept| {
                let candidate = subset(&kept);
                let cell = &cell;
                async move { cell.lock().await.fails("ddmin over the windows", &candidate).await }
            })
            .await
        };
        // All kept: no subset was tried as it stands, so it stays as it was.
        if found.kept.len() < windows.len() {
            best = subset(&found.kept);
        }
        if !found.minimal {
            return (best, false);
        }
    }
    // 3. Shorter holds, each halved while it still fails (down to 0.5 s).
    for i in 0..best.windows.len() {
        while best.windows[i].hold_ms / 2 >= 500 {
            let mut shorter = best.clone();
            shorter.windows[i].hold_ms /= 2;
            match trial.fails("a shorter hold", &shorter).await {
                Some(true) => best = shorter,
                Some(false) => break,
                None => return (best, false),
            }
        }
    }
    // 4. A weaker fault where one exists, then one fault at a time.
    for i in 0..best.windows.len() {
        if let Some(weaker) = weaker(&best.windows[i].fault) {
            let mut milder = best.clone();
            milder.windows[i].fault = weaker.to_owned();
            milder.windows[i].aim = None;
            match trial.fails("a weaker fault", &milder).await {
                Some(true) => best = milder,
                Some(false) => {}
                None => return (best, false),
            }
        }
    }
    if best.windows.iter().any(|w| w.lane != 0) {
        let mut one_lane = best.clone();
        for w in &mut one_lane.windows {
            w.lane = 0;
        }
        match trial.fails("one fault at a time", &one_lane).await {
            Some(true) => best = one_lane,
            Some(false) => {}
            None => return (best, false),
        }
    }
    // 5. The windows moved up, if ddmin did not already; the run ends 3 s
    // after its last window; then fewer clients.
    let earlier = best.clone().moved_up();
    if earlier.windows != best.windows {
        match trial.fails("earlier windows", &earlier).await {
            Some(true) => best = earlier,
            Some(false) => {}
            None => return (best, false),
        }
    }
    let last_end = best.windows.iter().map(|w| w.start_ms + w.hold_ms).max().unwrap_or(0);
    let limit = (last_end + 3_000).div_ceil(1000).max(5);
    if limit < best.time_limit_s {
        let shorter = Candidate { time_limit_s: limit, ..best.clone() };
        match trial.fails("a shorter run", &shorter).await {
            Some(true) => best = shorter,
            Some(false) => {}
            None => return (best, false),
        }
    }
    while best.concurrency > 1 {
        let fewer = Candidate { concurrency: best.concurrency / 2, ..best.clone() };
        match trial.fails("fewer clients", &fewer).await {
            Some(true) => best = fewer,
            Some(false) => break,
            None => return (best, false),
        }
    }
    (best, true)
}

/// The fault that does less of what `fault` does, to try in its place: a
/// link held slow rather than cut (the client still times out, but the
/// request arrives and the connection lives).
fn weaker(fault: &str) -> Option<&'static str> {
    (fault == crate::core::fault::Fault::Partition.name()).then(|| crate::core::fault::Fault::Delay.name())
}

/// The result's failing reruns out of `options.confirm`, each under a seed
/// of its own.
async fn confirm(trial: &mut Trial<'_>, after: &Candidate) -> Option<(u32, u32)> {
    let n = trial.options.confirm;
    if n == 0 {
        return None;
    }
    let mut failed = 0;
    for i in 0..n {
        if let Some(bar) = &trial.bar {
            bar.set_message(format!("confirming {}: rerun {} of {n}, {failed} failed", after.describe(), i + 1));
        }
        let options = trial.run_options(after, trial.base.seed.wrapping_add(100 + u64::from(i)));
        if let Ok((dir, results)) = child_run(&trial.options.haunt, &options, "confirm").await
            && kinds_of(&results).iter().any(|k| trial.kinds.contains(k))
        {
            failed += 1;
            trial.last_failing = Some(dir.display().to_string());
        }
    }
    Some((failed, n))
}

fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
}

fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that fails when an ack-loss window of at least 1 s is in it and
    /// the run lasts 6 s or more, whatever else it holds: what each step of
    /// the search may cut and what it must keep.
    struct Scripted {
        tries: Vec<Candidate>,
        budget: usize,
        rule: fn(&Candidate) -> bool,
    }

    fn loses_acks(c: &Candidate) -> bool {
        c.windows.iter().any(|w| w.fault == "ack-loss" && w.hold_ms >= 1000) && c.time_limit_s >= 6
    }

    impl Tries for Scripted {
        fn fails<'a>(&'a mut self, _: &'static str, c: &'a Candidate) -> BoxFuture<'a, Option<bool>> {
            Box::pin(async move {
                if self.tries.len() >= self.budget {
                    return None;
                }
                self.tries.push(c.clone());
                Some((self.rule)(c))
            })
        }
    }

    fn window(fault: &str, start_ms: u64, hold_ms: u64) -> PlannedWindow {
        PlannedWindow { lane: 0, fault: fault.into(), target: "t".into(), start_ms, hold_ms, aim: None }
    }

    fn start() -> Candidate {
        let windows = vec![
            window("kill", 1_000, 3_000),
            window("ack-loss", 6_000, 4_000),
            window("pause", 12_000, 3_000),
            window("delay", 17_000, 3_000),
            window("clock-skew", 22_000, 3_000),
            window("partition", 40_000, 3_000),
        ];
        Candidate { windows, time_limit_s: 60, concurrency: 8 }
    }

    #[tokio::test]
    async fn the_search_keeps_what_fails_and_cuts_the_rest() {
        let mut scripted = Scripted { tries: Vec::new(), budget: 100, rule: loses_acks };
        let (best, finished) = search(&mut scripted, start(), Some(8_000)).await;
        assert!(finished);
        // Cut 2 s after the first anomaly (10 s), ddmin to the ack loss moved
        // up to 1 s (the run cut 3 s after it: 8 s), its hold halved while it
        // fails (4 -> 2 -> 1 s), the run no shorter (6 s fails, the rule's
        // 5 s does not), the clients down to one.
        assert_eq!(best.windows, vec![window("ack-loss", 1_000, 1_000)], "{best:?}");
        assert_eq!(best.time_limit_s, 8);
        assert_eq!(best.concurrency, 1);
        // Minimal: without its one window, or with its hold halved again, it passes.
        assert!(scripted.tries.iter().any(|c| c.windows.len() == 1 && c.windows[0].hold_ms == 500));
        assert_eq!(best.describe(), "1 window (ack-loss t, 1.0 s), 8 s, 1 client");
    }

    /// The steps of a search that accepted `accepted` in turn (the last its
    /// result), with a passing try between each.
    fn accepted_in_turn(accepted: &[Candidate]) -> Vec<Step> {
        let mut steps = Vec::new();
        for c in accepted {
            let passing = Candidate { concurrency: 99, ..c.clone() };
            steps.push(Step { step: "t", candidate: passing, fails: false, reruns: Vec::new() });
            steps.push(Step { step: "t", candidate: c.clone(), fails: true, reruns: Vec::new() });
        }
        steps
    }

    fn clients(n: usize) -> Candidate {
        Candidate { windows: vec![window("ack-loss", 1_000, 1_000)], time_limit_s: 8, concurrency: n }
    }

    /// A result that failed once in the search and in none of its
    /// confirmation's reruns is set aside for the newest accepted candidate
    /// that fails again; a result that reproduces is kept as it is.
    #[tokio::test]
    async fn a_result_that_never_fails_again_gives_way_to_the_last_one_that_does() {
        let steps = accepted_in_turn(&[clients(8), clients(4), clients(2), clients(1)]);
        // 1 and 2 clients never fail again; 4 fails 3 times in 10.
        let rate = |c: &Candidate| if c.concurrency >= 4 { 3 } else { 0 };
        let mut asked = Vec::new();
        let (result, reproduced, set_aside) = walk_back(&steps, clients(1), |c| {
            asked.push(c.concurrency);
            let failed = rate(&c);
            Box::pin(async move { Some((failed, 10)) })
        })
        .await;
        assert_eq!(result, clients(4));
        assert_eq!(reproduced, Some((3, 10)));
        assert_eq!(asked, vec![1, 2, 4], "the result, then the accepted ones newest first, none twice");
        let aside: Vec<_> = set_aside.iter().map(|a| (a.candidate.as_str(), a.reproduced)).collect();
        assert_eq!(
            aside,
            vec![
                ("1 window (ack-loss t, 1.0 s), 8 s, 1 client", (0, 10)),
                ("1 window (ack-loss t, 1.0 s), 8 s, 2 clients", (0, 10))
            ]
        );

        let mut asked = 0;
        let (result, reproduced, set_aside) = walk_back(&steps, clients(1), |_| {
            asked += 1;
            Box::pin(async { Some((2, 10)) })
        })
        .await;
        assert_eq!((result, reproduced, set_aside.len(), asked), (clients(1), Some((2, 10)), 0, 1));
    }

    /// When no earlier candidate (at most [`WALK_BACK_MAX`] of them) fails
    /// again either, the result stands, said to reproduce in none; so does
    /// one never confirmed.
    #[tokio::test]
    async fn a_walk_back_that_finds_nothing_keeps_the_result_and_says_so() {
        let steps = accepted_in_turn(&[clients(16), clients(8), clients(4), clients(2), clients(1)]);
        let mut asked = Vec::new();
        let (result, reproduced, set_aside) = walk_back(&steps, clients(1), |c| {
            asked.push(c.concurrency);
            Box::pin(async { Some((0, 10)) })
        })
        .await;
        assert_eq!((result, reproduced), (clients(1), Some((0, 10))));
        assert_eq!(asked, vec![1, 2, 4, 8], "the result and three before it, not the fourth");
        assert_eq!(set_aside.len(), 3, "the three tried before it: {set_aside:?}");
        let (result, reproduced, set_aside) = walk_back(&steps, clients(1), |_| Box::pin(async { None })).await;
        assert_eq!((result, reproduced, set_aside.len()), (clients(1), None, 0));
    }

    #[tokio::test]
    async fn a_spent_budget_ends_with_the_smallest_failing_run_so_far() {
        let mut scripted = Scripted { tries: Vec::new(), budget: 2, rule: loses_acks };
        let (best, finished) = search(&mut scripted, start(), Some(8_000)).await;
        assert!(!finished);
        assert!(best.windows.iter().any(|w| w.fault == "ack-loss"), "it still fails: {best:?}");
        assert!(best.time_limit_s >= 6);
        assert_eq!(scripted.tries.len(), 2);
    }

    /// A client that times out on `client<->api` fails the run, whether the
    /// link is cut or slowed, in whichever lane: the partition becomes a
    /// delay, and the two lanes one.
    #[tokio::test]
    async fn a_partition_becomes_a_delay_and_the_lanes_one_where_it_still_fails() {
        fn times_out(c: &Candidate) -> bool {
            c.windows.iter().any(|w| matches!(w.fault.as_str(), "partition" | "delay") && w.hold_ms >= 1000)
        }
        let mut cut = window("partition", 2_000, 2_000);
        cut.lane = 1;
        let start = Candidate { windows: vec![window("kill", 1_000, 3_000), cut], time_limit_s: 20, concurrency: 1 };
        let mut scripted = Scripted { tries: Vec::new(), budget: 100, rule: times_out };
        let (best, finished) = search(&mut scripted, start, None).await;
        assert!(finished);
        assert_eq!(best.windows, vec![window("delay", 1_000, 1_000)], "{best:?}");
        let steps: Vec<&str> =
            scripted.tries.iter().map(|c| c.windows.first().map_or("", |w| w.fault.as_str())).collect();
        assert!(steps.contains(&"delay"), "{steps:?}");
    }
}
