//! The run, folded into one compact table of orders keyed by order id, built
//! by streaming both files once.
//!
//! Memory is what limits a checker of tens of millions of ops, so each logical
//! order is one record: its id once, small strings (items, workers) interned,
//! and what the final state says about it (its row, its applications, whether
//! its message is queued or parked) stored beside what the history says. Lines
//! that cannot be joined when read (an `applied` line before its `order` line)
//! wait in a side list and are joined at the end.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::ops::ControlFlow;
use std::path::Path;

use hashbrown::HashTable;
use haunt_format::chunks::{Chunks, Item};
use haunt_format::fast::{FinalSpans, OrderOpSpans};
use haunt_format::jsonl::is_cut_off;
use haunt_format::{FinalRef, FormatError, OpRef, OpType, OrderRef, Process, RawLine};

use crate::index::IdIndex;
use crate::key::{Key, Keys};
pub use crate::orders::{Applications, OptCount, Order, Orders, Row};
use crate::results::FaultWindow;
use crate::series::{OpsAt, Outcome, Timeline};

/// Small strings seen over and over (items, workers, fault targets) as numbers.
#[derive(Debug, Default)]
pub struct Interner {
    ids: HashMap<Box<str>, u32, hashbrown::DefaultHashBuilder>,
    pub names: Vec<Box<str>>,
}

impl Interner {
    pub fn id(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(s.into());
        self.ids.insert(s.into(), id);
        id
    }

    pub fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }
}

/// One application of an event, as kept for reporting.
#[derive(Debug, Clone, Copy)]
pub struct Application {
    pub attempt: u32,
    /// Interned in the fold's workers.
    pub worker: u32,
    pub applied_at_ms: i64,
    /// Its place in its item's order, where the system numbers them.
    pub key_seq: Option<u64>,
    /// When the relay published the message it came from, where recorded.
    pub publish_seq: Option<i64>,
}

/// An `applied` line that could not be joined to an order row's event.
#[derive(Debug, Clone)]
pub struct StrayApplied {
    pub event: Box<str>,
    pub order_id: Box<str>,
    pub item: u32,
    pub qty: i64,
    pub application: Application,
}

#[derive(Debug)]
struct Outstanding {
    line: u64,
    time_ns: u64,
    /// `None` for `order`, the common case, to save a copy per op.
    f: Option<Box<str>>,
    order: Option<u32>,
}

#[derive(Debug, Default)]
struct ProcessState {
    outstanding: Option<Outstanding>,
    crashed_at: Option<u64>,
}

/// The state of each process. Clients are numbered from 0 up, a new number
/// after each `info`, so most are kept in a vector by their number (a lookup
/// per op without hashing, and a long run's million retired processes packed
/// tight); a number far past the others, or a named process, goes to a map.
#[derive(Debug, Default)]
struct Processes {
    numbered: Vec<ProcessState>,
    other: HashMap<Process, ProcessState, hashbrown::DefaultHashBuilder>,
}

impl Processes {
    fn state(&mut self, process: &Process) -> &mut ProcessState {
        match *process {
            // At most doubling the vector (and a page of slack): a history
            // that numbers its processes sparsely stays in the map.
            Process::Client(n) if n < (self.numbered.len() as u64 + 4096) * 2 => {
                let n = n as usize;
                if n >= self.numbered.len() {
                    self.numbered.resize_with(n + 1, ProcessState::default);
                }
                &mut self.numbered[n]
            }
            _ => self.other.entry(process.clone()).or_default(),
        }
    }

    fn all(&mut self) -> impl Iterator<Item = &mut ProcessState> {
        self.numbered.iter_mut().chain(self.other.values_mut())
    }
}

/// A fault window being read. It ends at the last stop that stopped the fault:
/// one whose `value.result` is "ok" (or says nothing of failure, as a foreign
/// history's may). A stop whose result starts with "error" did not stop it.
/// haunt's nemesis records each action twice, before (no result) and after
/// (with its result), so a stop without a result waits for the next op of its
/// fault and target to learn whether it worked.
#[derive(Debug, Clone, Copy)]
struct WindowState {
    start_ns: u64,
    /// The last stop known to have stopped the fault.
    end_ns: Option<u64>,
    /// A stop whose result is not known yet.
    stopping_ns: Option<u64>,
    /// Opened by a start whose result is not known yet: a result that says it
    /// failed takes the window back (the fault never happened).
    starting: bool,
}

impl WindowState {
    /// The window as it stands if no more ops come: a stop without a result
    /// that nothing contradicted stopped the fault.
    fn settled_end(&self) -> Option<u64> {
        self.stopping_ns.or(self.end_ns)
    }
}

/// What a nemesis op's `value.result` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultResult {
    /// No result (the op before an action, or a history that records none).
    Unsaid,
    /// "ok", or any result that does not start with "error".
    Ok,
    /// A result that starts with "error": the action did not happen.
    Failed,
}

/// Everything the rules need, from both files.
#[derive(Debug, Default)]
pub struct Fold {
    pub orders: Orders,
    /// The ids of orders and events, packed; the ones that do not pack.
    pub keys: Keys,
    by_id: IdIndex,
    /// Orders by their row's event: built on the first lookup that the
    /// final state's own order does not answer, kept up to date after.
    by_event: HashTable<u32>,
    by_event_built: bool,
    /// The order the next `order` line most likely names (lines come in the
    /// order the orders were created, close to the history's), and the order
    /// of the last row read (its `applied` lines usually follow it).
    next_row_guess: u32,
    last_row: Option<u32>,
    hasher: hashbrown::DefaultHashBuilder,
    pub strings: Interner,
    /// The workers named by applications.
    pub workers: Interner,
    // History.
    pub latency_ok_ns: Vec<f64>,
    pub latency_fail_ns: Vec<f64>,
    pub latency_info_ns: Vec<f64>,
    pub ops: u64,
    pub client_ops: u64,
    pub nemesis_ops: u64,
    pub open_invokes: u64,
    pub history_truncated: bool,
    pub faults: Vec<FaultWindow>,
    /// When the first fault started: ops invoked before it are outside every
    /// fault window, so nothing more is kept of them than of any op.
    pub first_fault_ns: Option<u64>,
    /// Latencies (ns) of the ops completed before the first fault started.
    pub latency_before_faults_ns: Vec<f64>,
    /// Invoke time and latency (ns) of every op completed after the first
    /// fault started, to place it inside or outside the fault windows.
    pub latency_timed_ns: Vec<(u64, f64)>,
    /// Invoke times (ns) of the ops among those that completed `fail`, and
    /// of those that completed `info`: few, so kept apart rather than as an
    /// outcome beside every latency.
    pub failed_timed_ns: Vec<u64>,
    pub info_timed_ns: Vec<u64>,
    /// Completed client ops over time, in bounded buckets.
    pub ops_series: Timeline<OpsAt>,
    processes: Processes,
    windows: HashMap<(String, String), WindowState, hashbrown::DefaultHashBuilder>,
    window_order: Vec<(String, String)>,
    /// The partition leaders a window's start recorded, until it closes.
    fault_leaders: HashMap<(String, String), serde_json::Value, hashbrown::DefaultHashBuilder>,
    last: Option<(u64, u64)>,
    // Final state.
    pub final_present: bool,
    pub final_truncated: bool,
    /// The cut line of a truncated final state (1-based).
    pub final_truncated_line: u64,
    pub stray_applied: Vec<StrayApplied>,
    /// Pending and dead-letter lines whose event is not an order row's.
    unjoined_pending: Vec<Box<str>>,
    unjoined_dead: Vec<Box<str>>,
    pub applied_lines: u64,
    /// `applied` lines that carried a `key_seq`: the run recorded application order.
    pub key_seq_lines: u64,
    /// `applied` lines that carried a `publish_seq`: the run recorded publish order.
    pub publish_seq_lines: u64,
    /// Applied qty by item, over every applied line (i128: no sum of i64s wraps).
    pub applied_sum: HashMap<u32, i128, hashbrown::DefaultHashBuilder>,
    pub projection: HashMap<u32, i64, hashbrown::DefaultHashBuilder>,
    pub delivery_histogram: std::collections::BTreeMap<u32, u64>,
    pub pending_lines: u64,
    pub dead_letter_lines: u64,
    pub meta: Option<haunt_format::Meta>,
    /// Every application of the joined events applied more than once.
    pub applications: HashMap<u32, Vec<Application>, hashbrown::DefaultHashBuilder>,
    /// Why the first application that does not match its order is wrong, by order.
    pub mismatches: HashMap<u32, String, hashbrown::DefaultHashBuilder>,
}

/// A nemesis op's target (`value.target`, else `value.targets`) and result.
fn fault_target(value: &str) -> (String, FaultResult, Option<serde_json::Value>) {
    #[derive(serde::Deserialize)]
    struct Target {
        #[serde(default)]
        target: Option<serde_json::Value>,
        #[serde(default)]
        targets: Option<serde_json::Value>,
        #[serde(default)]
        result: Option<serde_json::Value>,
        #[serde(default)]
        leaders: Option<serde_json::Value>,
    }
    let Ok(parsed) = serde_json::from_str::<Target>(value) else {
        return (String::new(), FaultResult::Unsaid, None);
    };
    let result = match &parsed.result {
        None | Some(serde_json::Value::Null) => FaultResult::Unsaid,
        Some(serde_json::Value::String(r)) if r.starts_with("error") => FaultResult::Failed,
        Some(_) => FaultResult::Ok,
    };
    let target = match parsed.target.or(parsed.targets) {
        Some(serde_json::Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => String::new(),
    };
    (target, result, parsed.leaders.filter(|l| !l.is_null()))
}

impl Fold {
    /// Makes room for about `orders` orders up front: growing the tables by
    /// doubling cost a tenth of a large check in rehashing.
    pub fn reserve(&mut self, orders: usize) {
        self.orders.reserve(orders);
        let (table, hasher) = (&self.orders, &self.hasher);
        self.by_id.reserve(orders, |j| hasher.hash_one(table.id(j)));
    }

    /// `time_ns` of the history's last op (0 for an empty history).
    pub fn last_time_ns(&self) -> u64 {
        self.last.map_or(0, |(_, t)| t)
    }

    /// The order with id `id`.
    pub fn order(&self, id: &str) -> Option<Order> {
        let key = self.keys.find(id)?;
        let hash = self.hasher.hash_one(key);
        self.by_id.find(hash, |i| self.orders.id(i) == key).map(|i| self.orders.get(i))
    }

    /// The text of an id.
    pub fn text(&self, key: Key) -> String {
        self.keys.str(&key).into_owned()
    }

    fn order_index(&mut self, id: &str) -> u32 {
        let key = self.keys.key(id);
        let hash = self.hasher.hash_one(key);
        let orders = &self.orders;
        if let Some(i) = self.by_id.find(hash, |i| orders.id(i) == key) {
            return i;
        }
        let (orders, hasher) = (&self.orders, &self.hasher);
        let i = self.by_id.push(hash, |j| hasher.hash_one(orders.id(j)));
        let pushed = self.orders.push(key);
        debug_assert_eq!(i, pushed, "the index holds every order, in order");
        i
    }

    /// Starts fetching what looking up order `id` will read, a few lines
    /// before the fold gets to it (see [`crate::index`]).
    pub fn prefetch_order(&self, id: &str) {
        if let Some(key) = self.keys.find(id) {
            self.by_id.prefetch(self.hasher.hash_one(key));
        }
    }

    fn event_index(&mut self, event: &str) -> Option<u32> {
        let key = self.keys.find(event)?;
        if let Some(i) = self.last_row.filter(|&i| self.orders.row_event(i) == Some(key)) {
            return Some(i);
        }
        if !self.by_event_built {
            self.by_event_built = true;
            let (orders, hasher) = (&self.orders, &self.hasher);
            self.by_event.reserve(orders.len(), |&j| hasher.hash_one(orders.row_event(j).unwrap_or_default()));
            for i in 0..self.orders.len() as u32 {
                if self.orders.row_event(i).is_some() {
                    self.index_event(i);
                }
            }
        }
        let hash = self.hasher.hash_one(key);
        self.by_event.find(hash, |&i| self.orders.row_event(i) == Some(key)).copied()
    }

    fn index_event(&mut self, i: u32) {
        let (orders, hasher) = (&self.orders, &self.hasher);
        let event = |j: u32| orders.row_event(j).unwrap_or_default();
        self.by_event.insert_unique(hasher.hash_one(event(i)), i, |&j| hasher.hash_one(event(j)));
    }

    /// The order an `order` line names: usually the next one in the table.
    fn row_order_index(&mut self, id: &str) -> u32 {
        let guess = self.next_row_guess;
        let i = match self.keys.find(id) {
            Some(key) if (guess as usize) < self.orders.len() && self.orders.id(guess) == key => guess,
            _ => self.order_index(id),
        };
        self.next_row_guess = i + 1;
        i
    }

    /// One op; `order` is its value when the fast path already read it.
    pub fn push_op(
        &mut self,
        file: &Path,
        line: u64,
        op: &OpRef<'_>,
        order: Option<&OrderRef<'_>>,
    ) -> Result<(), FormatError> {
        let err = |message: String| FormatError::line(file, line, message);
        self.follow(op).map_err(err)?;
        self.ops += 1;
        if op.process.is_nemesis() {
            return self.push_nemesis_op(op).map_err(err);
        }
        self.client_ops += 1;
        let read;
        let order = match order {
            Some(order) => Some(order),
            None if op.is_client_order() => {
                read = op.order().map_err(err)?;
                Some(&read)
            }
            None => None,
        };
        if order.is_none() {
            op.check_other_value().map_err(err)?;
        }
        if op.kind == OpType::Invoke {
            self.push_invoke(line, op, order).map_err(err)
        } else {
            self.push_completion(line, op, order).map_err(err)
        }
    }

    /// Checks that an op comes after the last one, in index and in time, and
    /// makes it the last.
    fn follow(&mut self, op: &OpRef<'_>) -> Result<(), String> {
        if let Some((last_index, last_time)) = self.last {
            if op.index <= last_index {
                return Err(format!("index {} does not increase (previous op has index {last_index})", op.index));
            }
            if op.time_ns < last_time {
                return Err(format!("time_ns {} goes backwards (previous op at {last_time})", op.time_ns));
            }
        }
        self.last = Some((op.index, op.time_ns));
        Ok(())
    }

    /// A nemesis op: one edge of a fault window.
    fn push_nemesis_op(&mut self, op: &OpRef<'_>) -> Result<(), String> {
        op.check_other_value()?;
        self.nemesis_ops += 1;
        let (target, result, leaders) = fault_target(op.value);
        self.push_fault(&op.f, target, result, op.time_ns, leaders);
        Ok(())
    }

    /// A client's invoke, at `line`: it becomes the process's outstanding op,
    /// and an attempt at its order if it is one.
    fn push_invoke(&mut self, line: u64, op: &OpRef<'_>, order: Option<&OrderRef<'_>>) -> Result<(), String> {
        let process = &op.process;
        let state = self.processes.state(process);
        if let Some(crashed) = state.crashed_at {
            return Err(format!(
                "process {process} invokes again after its info at line {crashed}; \
                 a client continues under a new process number"
            ));
        }
        if let Some(o) = &state.outstanding {
            return Err(format!("process {process} invokes while its invoke at line {} is outstanding", o.line));
        }
        let f = (op.f != "order").then(|| Box::<str>::from(&*op.f));
        let order = order.map(|v| self.invoke_order(v, op.time_ns));
        let state = self.processes.state(process);
        state.outstanding = Some(Outstanding { line, time_ns: op.time_ns, f, order });
        Ok(())
    }

    /// An attempt at the order an invoke names, at `time_ns`; the order's index.
    fn invoke_order(&mut self, v: &OrderRef<'_>, time_ns: u64) -> u32 {
        let id = v.order_id.as_deref().expect("checked by OpRef::order");
        let item_name = v.item_id.as_deref().expect("checked by OpRef::order");
        let item = self.strings.id(item_name);
        let i = self.order_index(id);
        self.orders.update(i, |o| {
            if !o.invoked {
                o.invoked = true;
                o.item = item;
                o.qty = v.qty.expect("checked by OpRef::order");
                o.first_invoke_ns = time_ns;
            }
            o.attempts += 1;
        });
        i
    }

    /// A client's completion, at `line`, of its process's outstanding invoke.
    fn push_completion(&mut self, line: u64, op: &OpRef<'_>, order: Option<&OrderRef<'_>>) -> Result<(), String> {
        let process = &op.process;
        let state = self.processes.state(process);
        let Some(invoke) = state.outstanding.take() else {
            return Err(format!("{} completion from process {process} with no outstanding invoke", op.kind.as_str()));
        };
        let invoke_f = invoke.f.as_deref().unwrap_or("order");
        if invoke_f != op.f {
            return Err(format!(
                "completion f \"{}\" does not match the invoke at line {} (f \"{invoke_f}\")",
                op.f, invoke.line
            ));
        }
        if op.kind == OpType::Info {
            state.crashed_at = Some(line);
        }
        self.time_completion(invoke.time_ns, op);
        match (invoke.order, order) {
            (Some(i), Some(v)) => self.complete_order(i, invoke.line, v, op),
            _ => Ok(()),
        }
    }

    /// The latency and outcome of an op invoked at `invoke_ns` and completed by `op`.
    fn time_completion(&mut self, invoke_ns: u64, op: &OpRef<'_>) {
        let latency = (op.time_ns - invoke_ns) as f64;
        if self.first_fault_ns.is_some() {
            self.latency_timed_ns.push((invoke_ns, latency));
        }
        let outcome = match op.kind {
            OpType::Ok => {
                self.latency_ok_ns.push(latency);
                Outcome::Ok
            }
            OpType::Fail => {
                self.latency_fail_ns.push(latency);
                Outcome::Fail
            }
            _ => {
                self.latency_info_ns.push(latency);
                Outcome::Info
            }
        };
        if self.first_fault_ns.is_some() {
            match outcome {
                Outcome::Fail => self.failed_timed_ns.push(invoke_ns),
                Outcome::Info => self.info_timed_ns.push(invoke_ns),
                _ => {}
            }
        }
        self.ops_series.push_op(invoke_ns, outcome, op.time_ns - invoke_ns);
    }

    /// The outcome of an attempt at the `i`th order, whose invoke is at
    /// `invoke_line`: `v` is the completion's value.
    fn complete_order(&mut self, i: u32, invoke_line: u64, v: &OrderRef<'_>, op: &OpRef<'_>) -> Result<(), String> {
        let id = self.orders.id(i);
        if let Some(named) = v.order_id.as_deref()
            && !named.is_empty()
            && !self.keys.is(&id, named)
        {
            return Err(format!(
                "completion names order_id \"{named}\" but its invoke at line {invoke_line} names \"{}\"",
                self.text(id)
            ));
        }
        let ack_event = match (op.kind, v.event_id.as_deref()) {
            (OpType::Ok, Some(e)) => Some(self.keys.key(e)),
            _ => None,
        };
        self.orders.update(i, |o| match op.kind {
            OpType::Ok => {
                o.ok += 1;
                o.first_ok_ns.get_or_insert(op.time_ns);
                if o.ack_event.is_none() {
                    o.ack_event = ack_event;
                }
            }
            OpType::Fail => o.fail += 1,
            _ => o.unknown += 1,
        });
        Ok(())
    }
}

impl Fold {
    fn push_fault(&mut self, f: &str, target: String, result: FaultResult, t: u64, leaders: Option<serde_json::Value>) {
        let (family, starts) = haunt_format::fault_edge(f);
        let key = (family.to_owned(), target);
        // A start's first op says who led what as it struck; kept for the
        // window it opens (its second op says nothing of them).
        let leaders = leaders.filter(|_| starts);
        let opened =
            |t| WindowState { start_ns: t, end_ns: None, stopping_ns: None, starting: result == FaultResult::Unsaid };
        let Some(mut w) = self.windows.get(&key).copied() else {
            // A stop with no start (the history began mid-fault), or a start
            // that failed: nothing to shade.
            if starts && result != FaultResult::Failed {
                if self.first_fault_ns.is_none() {
                    self.start_timing();
                    self.first_fault_ns = Some(t);
                }
                self.window_order.push(key.clone());
                if let Some(leaders) = leaders {
                    self.fault_leaders.insert(key.clone(), leaders);
                }
                self.windows.insert(key, opened(t));
            }
            return;
        };
        if starts {
            // A start after the fault was stopped begins the next window; one
            // while it runs (the start's own second op, or a start after a
            // stop that failed) belongs to this one.
            if let Some(end_ns) = w.settled_end() {
                let mut window = FaultWindow::new(&key.0, &key.1, w.start_ns, Some(end_ns));
                window.leaders = self.fault_leaders.remove(&key);
                self.faults.push(window);
                if result == FaultResult::Failed {
                    self.windows.remove(&key);
                    return;
                }
                if let Some(leaders) = leaders {
                    self.fault_leaders.insert(key.clone(), leaders);
                }
                w = opened(t);
            } else if w.starting {
                match result {
                    // The start's own result: it never happened.
                    FaultResult::Failed => {
                        self.windows.remove(&key);
                        self.fault_leaders.remove(&key);
                        return;
                    }
                    FaultResult::Ok => w.starting = false,
                    FaultResult::Unsaid => {}
                }
            }
        } else {
            w.starting = false;
            match result {
                FaultResult::Unsaid => {
                    w.end_ns = w.settled_end();
                    w.stopping_ns = Some(t);
                }
                FaultResult::Ok => {
                    w.end_ns = Some(t);
                    w.stopping_ns = None;
                }
                // The stop did not happen: the fault runs on (until a stop that works).
                FaultResult::Failed => w.stopping_ns = None,
            }
        }
        self.windows.insert(key, w);
    }

    /// From the first fault on, ops are kept with their invoke time; the ones
    /// completed before are outside every window.
    fn start_timing(&mut self) {
        let before = [&self.latency_ok_ns, &self.latency_fail_ns, &self.latency_info_ns];
        self.latency_before_faults_ns = before.into_iter().flatten().copied().collect();
    }

    /// Ends the history: open invokes become indeterminate, open fault windows
    /// are reported as still open.
    pub fn finish_history(&mut self) {
        for state in self.processes.all() {
            if let Some(invoke) = state.outstanding.take() {
                self.open_invokes += 1;
                if let Some(i) = invoke.order {
                    self.orders.update(i, |o| o.unknown += 1);
                }
            }
        }
        for key in std::mem::take(&mut self.window_order) {
            if let Some(w) = self.windows.remove(&key) {
                let mut window = FaultWindow::new(&key.0, &key.1, w.start_ns, w.settled_end());
                window.leaders = self.fault_leaders.remove(&key);
                self.faults.push(window);
            }
        }
        self.faults.sort_by(|a, b| (a.start_ns, &a.fault, &a.target).cmp(&(b.start_ns, &b.fault, &b.target)));
    }

    pub fn push_final(&mut self, file: &Path, line: u64, l: &FinalRef<'_>) -> Result<(), FormatError> {
        l.check().map_err(|e| FormatError::line(file, line, e))?;
        let s = |c: &Option<Cow<'_, str>>| -> String { c.as_deref().unwrap_or_default().to_owned() };
        match &*l.kind {
            "order" => {
                let id = l.order_id.as_deref().unwrap_or_default();
                let item = self.strings.id(l.item_id.as_deref().unwrap_or_default());
                let i = self.row_order_index(id);
                let mut o = self.orders.get(i);
                if o.row.is_some() {
                    o.extra_rows += 1;
                    self.orders.set(i, o);
                    return Ok(());
                }
                let event = self.keys.key(l.event_id.as_deref().unwrap_or_default());
                let count = |n: Option<u32>, field: &str| {
                    OptCount::new(n)
                        .ok_or_else(|| FormatError::line(file, line, format!("{field} {} is out of range", u32::MAX)))
                };
                o.row = Some(Row {
                    item,
                    deliveries: count(l.deliveries, "deliveries")?,
                    duplicates_absorbed: count(l.duplicates_absorbed, "duplicates_absorbed")?,
                    qty: l.qty.unwrap_or_default(),
                    event,
                });
                self.orders.set(i, o);
                self.last_row = Some(i);
                if self.by_event_built {
                    self.index_event(i);
                }
            }
            "applied" => {
                self.applied_lines += 1;
                let item = self.strings.id(l.item_id.as_deref().unwrap_or_default());
                let qty = l.qty.unwrap_or_default();
                let attempt = l.delivery_attempt.unwrap_or_default();
                *self.applied_sum.entry(item).or_default() += i128::from(qty);
                *self.delivery_histogram.entry(attempt).or_default() += 1;
                let application = Application {
                    attempt,
                    worker: self.workers.id(l.worker_id.as_deref().unwrap_or_default()),
                    applied_at_ms: l.applied_at_ms.unwrap_or_default(),
                    key_seq: l.key_seq,
                    publish_seq: l.publish_seq,
                };
                if l.key_seq.is_some() {
                    self.key_seq_lines += 1;
                }
                if l.publish_seq.is_some() {
                    self.publish_seq_lines += 1;
                }
                let (event, order_id) =
                    (l.event_id.as_deref().unwrap_or_default(), l.order_id.as_deref().unwrap_or_default());
                // Usually the row came first; what it cannot join yet waits for the
                // end, and only then is copied.
                if !self.join_applied(event, order_id, item, qty, application) {
                    self.stray_applied.push(StrayApplied {
                        event: event.into(),
                        order_id: order_id.into(),
                        item,
                        qty,
                        application,
                    });
                }
            }
            "projection" => {
                let item = self.strings.id(l.item_id.as_deref().unwrap_or_default());
                self.projection.insert(item, l.reserved_qty.unwrap_or_default());
            }
            "pending" => {
                self.pending_lines += 1;
                match self.event_index(l.event_id.as_deref().unwrap_or_default()) {
                    Some(i) => self.orders.update(i, |o| o.pending = true),
                    None => self.unjoined_pending.push(s(&l.event_id).into()),
                }
            }
            "dead_letter" => {
                self.dead_letter_lines += 1;
                match self.event_index(l.event_id.as_deref().unwrap_or_default()) {
                    Some(i) => self.orders.update(i, |o| o.dead = true),
                    None => self.unjoined_dead.push(s(&l.event_id).into()),
                }
            }
            "meta" => {
                self.meta = Some(haunt_format::Meta {
                    quiesced: l.quiesced.unwrap_or_default(),
                    read_at_ns: l.read_at_ns.unwrap_or_default(),
                    run_started_at_ms: l.run_started_at_ms.unwrap_or_default(),
                    ledger: l.ledger,
                    unlisted: l.unlisted,
                })
            }
            _ => unreachable!("FinalRef::check accepts only the known kinds"),
        }
        Ok(())
    }

    /// Joins applications, queued and parked messages to the order rows whose
    /// event they carry. What joins nothing stays in `stray_applied`.
    pub fn finish_final(&mut self) {
        for event in std::mem::take(&mut self.unjoined_pending) {
            if let Some(i) = self.event_index(&event) {
                self.orders.update(i, |o| o.pending = true);
            }
        }
        for event in std::mem::take(&mut self.unjoined_dead) {
            if let Some(i) = self.event_index(&event) {
                self.orders.update(i, |o| o.dead = true);
            }
        }
        let mut stray = Vec::new();
        for a in std::mem::take(&mut self.stray_applied) {
            if !self.join_applied(&a.event, &a.order_id, a.item, a.qty, a.application) {
                stray.push(a);
            }
        }
        self.stray_applied = stray;
    }

    /// Joins an application to the order row whose event it carries; false
    /// when no row (yet) has that event.
    fn join_applied(&mut self, event: &str, order_id: &str, item: u32, qty: i64, application: Application) -> bool {
        let Some(i) = self.event_index(event) else {
            return false;
        };
        let mut o = self.orders.get(i);
        let row = o.row.expect("joined by its row's event");
        if !o.applied.mismatch {
            let mut diffs = Vec::new();
            if !self.keys.is(&o.id, order_id) {
                diffs.push(format!("order_id {} (the event belongs to order {})", order_id, self.text(o.id)));
            }
            if item != row.item {
                diffs.push(format!("item_id {} (order has {})", self.strings.name(item), self.strings.name(row.item)));
            }
            if qty != row.qty {
                diffs.push(format!("qty {} (order has {})", qty, row.qty));
            }
            if !diffs.is_empty() {
                o.applied.mismatch = true;
                self.mismatches.insert(i, format!("applied line does not match its order: {}", diffs.join(", ")));
            }
        }
        let apps = &mut o.applied;
        apps.count += 1;
        if apps.count == 1 {
            apps.min_attempt = application.attempt;
            apps.min_applied_at_ms = application.applied_at_ms;
            apps.min_key_seq = application.key_seq;
            apps.first_publish_seq = application.publish_seq;
            apps.first_worker = application.worker;
        } else {
            if apps.count == 2 {
                // The first, which was kept as the least of each.
                let first = Application {
                    attempt: apps.min_attempt,
                    worker: apps.first_worker,
                    applied_at_ms: apps.min_applied_at_ms,
                    key_seq: apps.min_key_seq,
                    publish_seq: apps.first_publish_seq,
                };
                self.applications.entry(i).or_default().push(first);
            }
            let earlier = match (apps.min_key_seq, application.key_seq) {
                (Some(a), Some(b)) => b < a,
                (a, b) => a.is_none() && b.is_some(),
            };
            if earlier {
                apps.min_key_seq = application.key_seq;
                apps.first_publish_seq = application.publish_seq;
            }
            apps.min_attempt = apps.min_attempt.min(application.attempt);
            apps.min_applied_at_ms = apps.min_applied_at_ms.min(application.applied_at_ms);
            self.applications.entry(i).or_default().push(application);
        }
        self.orders.set(i, o);
        true
    }
}

/// Parses one line through serde (what the fast paths leave), validating its
/// UTF-8 once for the whole line (vectorized) rather than string by string as
/// `serde_json::from_slice` does.
fn parse<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// A history line: a client order op with its value read by the fast path, or
/// any op through serde (its value read later, if it is an order).
struct ParsedOp<'a>(OpRef<'a>, Option<OrderRef<'a>>);

impl<'de> serde::Deserialize<'de> for ParsedOp<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(ParsedOp(OpRef::deserialize(d)?, None))
    }
}

/// How many lines ahead of the fold [`fold_history`] starts fetching an
/// invoke's order: about as many lookups as the memory can serve at once.
const PREFETCH_AHEAD: usize = 16;

/// Folds `history.jsonl`, given as chunks of lines whose client order ops
/// are already read ([`haunt_format::chunks`]).
pub fn fold_history<R: std::io::Read>(
    fold: &mut Fold,
    file: &Path,
    mut chunks: Chunks<R, OrderOpSpans>,
) -> Result<(), FormatError> {
    'chunks: while let Some(chunk) = chunks.next_chunk() {
        let chunk = chunk.map_err(|source| FormatError::Io { file: file.to_owned(), source })?;
        // The lines PREFETCH_AHEAD further on: the orders their invokes name
        // are fetched while the fold reads the lines before them.
        let mut ahead = chunk.items().skip(PREFETCH_AHEAD);
        for item in chunk.items() {
            if let Some(Item::Parsed { text, parsed, .. }) = ahead.next()
                && let Some(id) = parsed.invoked_order_id(text)
            {
                fold.prefetch_order(id);
            }
            match item {
                Item::Parsed { line, text, parsed } => {
                    let (op, order) = parsed.get(text);
                    fold.push_op(file, line, &op, Some(&order))?;
                }
                Item::Raw(raw) => {
                    if fold_raw_op(fold, file, raw)?.is_break() {
                        break 'chunks;
                    }
                }
            }
        }
        drop(ahead);
        chunks.give_back(chunk);
    }
    fold.finish_history();
    Ok(())
}

/// A history line the parsing thread left: anything but a plain client
/// order op, or a line of a chunk that is not all UTF-8. `Break` at a cut
/// last line, which ends the history.
fn fold_raw_op(fold: &mut Fold, file: &Path, raw: RawLine<'_>) -> Result<ControlFlow<()>, FormatError> {
    let (line, complete) = (raw.line, raw.complete);
    if let Ok(text) = std::str::from_utf8(raw.bytes)
        && let Some((op, order)) = haunt_format::fast::client_order_op(text)
    {
        fold.push_op(file, line, &op, Some(&order))?;
        return Ok(ControlFlow::Continue(()));
    }
    match parse::<ParsedOp<'_>>(raw.bytes) {
        Ok(ParsedOp(ref op, ref order)) => fold.push_op(file, line, op, order.as_ref())?,
        Err(_) if !complete && is_cut_off(raw.bytes) => {
            fold.history_truncated = true;
            return Ok(ControlFlow::Break(()));
        }
        Err(e) => return Err(FormatError::line(file, line, e)),
    }
    Ok(ControlFlow::Continue(()))
}

/// Folds `final-state.jsonl`, given as chunks of lines already read where
/// the fast path reads them.
pub fn fold_final<R: std::io::Read>(
    fold: &mut Fold,
    file: &Path,
    mut chunks: Chunks<R, FinalSpans>,
) -> Result<(), FormatError> {
    fold.final_present = true;
    'chunks: while let Some(chunk) = chunks.next_chunk() {
        let chunk = chunk.map_err(|source| FormatError::Io { file: file.to_owned(), source })?;
        for item in chunk.items() {
            match item {
                Item::Parsed { line, text, parsed } => fold.push_final(file, line, &parsed.get(text))?,
                Item::Raw(raw) => {
                    if fold_raw_final(fold, file, raw)?.is_break() {
                        break 'chunks;
                    }
                }
            }
        }
        chunks.give_back(chunk);
    }
    fold.finish_final();
    Ok(())
}

/// A final-state line the parsing thread left; `Break` at a cut last line.
fn fold_raw_final(fold: &mut Fold, file: &Path, raw: RawLine<'_>) -> Result<ControlFlow<()>, FormatError> {
    let (line, complete) = (raw.line, raw.complete);
    if let Ok(text) = std::str::from_utf8(raw.bytes)
        && let Some(l) = haunt_format::fast::final_line(text)
    {
        fold.push_final(file, line, &l)?;
        return Ok(ControlFlow::Continue(()));
    }
    match parse::<FinalRef<'_>>(raw.bytes) {
        // A line that parses is whole, newline or not: what it lacks is an error.
        Ok(ref l) => fold.push_final(file, line, l)?,
        Err(_) if !complete && is_cut_off(raw.bytes) => {
            fold.final_truncated = true;
            fold.final_truncated_line = line;
            return Ok(ControlFlow::Break(()));
        }
        Err(e) => return Err(FormatError::line(file, line, e)),
    }
    Ok(ControlFlow::Continue(()))
}
