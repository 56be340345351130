//! Folds `history.jsonl` into logical orders, latencies and fault windows, and
//! rejects histories that break Jepsen's op rules.

use std::collections::HashMap;
use std::path::Path;

use haunt_format::{FormatError, Line, Op, OpType, OpValue, Process};

use crate::results::FaultWindow;

/// All attempts at one order id, across processes.
#[derive(Debug, Clone)]
pub struct LogicalOrder {
    pub order_id: String,
    pub item_id: String,
    pub qty: i64,
    pub attempts: u32,
    pub ok: u32,
    pub fail: u32,
    /// Completed `info`, or never completed.
    pub unknown: u32,
    /// From `ok` completions; one in a correct system.
    pub event_ids: Vec<String>,
    pub first_invoke_ns: u64,
    pub first_ok_ns: Option<u64>,
}

impl LogicalOrder {
    pub fn acknowledged(&self) -> bool {
        self.ok > 0
    }

    /// Every attempt certainly had no effect.
    pub fn failed(&self) -> bool {
        self.ok == 0 && self.unknown == 0 && self.fail > 0
    }

    pub fn indeterminate(&self) -> bool {
        !self.acknowledged() && !self.failed()
    }

    pub fn event_id(&self) -> Option<&str> {
        self.event_ids.first().map(String::as_str)
    }
}

#[derive(Debug)]
struct Outstanding {
    line: u64,
    time_ns: u64,
    f: String,
    /// Index into `HistoryFold::orders` for `order` invokes.
    order: Option<usize>,
}

#[derive(Debug, Default)]
struct ProcessState {
    outstanding: Option<Outstanding>,
    /// Line of the `info` completion after which this process may not invoke.
    crashed_at: Option<u64>,
}

/// Open/closing state of one fault family on one target. A fault action is
/// logged twice (its start and its completion, both `info`), so a window opens at
/// the first start op and closes at the last stop op before the next start.
#[derive(Debug, Clone, Copy)]
enum WindowState {
    Open { start_ns: u64 },
    Closing { start_ns: u64, end_ns: u64 },
}

/// The history, folded.
#[derive(Debug, Default)]
pub struct HistoryFold {
    /// In order of first invoke, so examples come out in history order.
    pub orders: Vec<LogicalOrder>,
    pub order_index: HashMap<String, usize>,
    /// Completion latency in ns, by outcome.
    pub latency_ok_ns: Vec<f64>,
    pub latency_fail_ns: Vec<f64>,
    pub latency_info_ns: Vec<f64>,
    pub ops: u64,
    pub client_ops: u64,
    pub nemesis_ops: u64,
    pub open_invokes: u64,
    pub truncated: bool,
    pub faults: Vec<FaultWindow>,
    processes: HashMap<Process, ProcessState>,
    windows: HashMap<(String, String), WindowState>,
    /// Keeps `windows` reported in the order they opened.
    window_order: Vec<(String, String)>,
    last: Option<(u64, u64)>,
}

/// Which fault family an op belongs to and whether it starts or stops it.
fn fault_family(f: &str) -> (&str, bool) {
    match f {
        "kill" => ("kill", true),
        "restart" => ("kill", false),
        "pause" => ("pause", true),
        "resume" => ("pause", false),
        _ => {
            if let Some(rest) = f.strip_prefix("start-") {
                (rest, true)
            } else if let Some(rest) = f.strip_prefix("stop-") {
                (rest, false)
            } else {
                (f, true)
            }
        }
    }
}

fn fault_target(value: &OpValue) -> String {
    let OpValue::Other(v) = value else {
        return String::new();
    };
    match v.get("target").or_else(|| v.get("targets")) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    }
}

impl HistoryFold {
    pub fn push(&mut self, file: &Path, line: u64, op: Op) -> Result<(), FormatError> {
        let err = |message: String| FormatError::line(file, line, message);
        if let Some((last_index, last_time)) = self.last {
            if op.index <= last_index {
                return Err(err(format!("index {} does not increase (previous op has index {last_index})", op.index)));
            }
            if op.time_ns < last_time {
                return Err(err(format!("time_ns {} goes backwards (previous op at {last_time})", op.time_ns)));
            }
        }
        self.last = Some((op.index, op.time_ns));
        self.ops += 1;
        if op.process.is_nemesis() {
            self.nemesis_ops += 1;
            self.push_fault(&op);
            return Ok(());
        }
        self.client_ops += 1;
        let state = self.processes.entry(op.process.clone()).or_default();
        match op.kind {
            OpType::Invoke => {
                if let Some(crashed) = state.crashed_at {
                    return Err(err(format!(
                        "process {} invokes again after its info at line {crashed}; \
                         a client continues under a new process number",
                        op.process
                    )));
                }
                if let Some(o) = &state.outstanding {
                    return Err(err(format!(
                        "process {} invokes while its invoke at line {} is outstanding",
                        op.process, o.line
                    )));
                }
                let order = match &op.value {
                    OpValue::Order(v) => {
                        let i = match self.order_index.get(&v.order_id) {
                            Some(&i) => i,
                            None => {
                                self.orders.push(LogicalOrder {
                                    order_id: v.order_id.clone(),
                                    item_id: v.item_id.clone(),
                                    qty: v.qty,
                                    attempts: 0,
                                    ok: 0,
                                    fail: 0,
                                    unknown: 0,
                                    event_ids: Vec::new(),
                                    first_invoke_ns: op.time_ns,
                                    first_ok_ns: None,
                                });
                                self.order_index.insert(v.order_id.clone(), self.orders.len() - 1);
                                self.orders.len() - 1
                            }
                        };
                        self.orders[i].attempts += 1;
                        Some(i)
                    }
                    OpValue::Other(_) => None,
                };
                state.outstanding = Some(Outstanding { line, time_ns: op.time_ns, f: op.f, order });
            }
            OpType::Ok | OpType::Fail | OpType::Info => {
                let Some(invoke) = state.outstanding.take() else {
                    return Err(err(format!(
                        "{} completion from process {} with no outstanding invoke",
                        op.kind.as_str(),
                        op.process
                    )));
                };
                if invoke.f != op.f {
                    return Err(err(format!(
                        "completion f \"{}\" does not match the invoke at line {} (f \"{}\")",
                        op.f, invoke.line, invoke.f
                    )));
                }
                if op.kind == OpType::Info {
                    state.crashed_at = Some(line);
                }
                let latency = (op.time_ns - invoke.time_ns) as f64;
                match op.kind {
                    OpType::Ok => self.latency_ok_ns.push(latency),
                    OpType::Fail => self.latency_fail_ns.push(latency),
                    _ => self.latency_info_ns.push(latency),
                }
                if let (Some(i), OpValue::Order(v)) = (invoke.order, &op.value) {
                    let order = &mut self.orders[i];
                    if !v.order_id.is_empty() && v.order_id != order.order_id {
                        return Err(err(format!(
                            "completion names order_id \"{}\" but its invoke at line {} \
                             names \"{}\"",
                            v.order_id, invoke.line, order.order_id
                        )));
                    }
                    match op.kind {
                        OpType::Ok => {
                            order.ok += 1;
                            order.first_ok_ns.get_or_insert(op.time_ns);
                            if let Some(e) = &v.event_id {
                                if !order.event_ids.contains(e) {
                                    order.event_ids.push(e.clone());
                                }
                            }
                        }
                        OpType::Fail => order.fail += 1,
                        _ => order.unknown += 1,
                    }
                }
            }
        }
        Ok(())
    }

    fn push_fault(&mut self, op: &Op) {
        let (family, starts) = fault_family(&op.f);
        let key = (family.to_owned(), fault_target(&op.value));
        let t = op.time_ns;
        let state = self.windows.get(&key).copied();
        let next = match (state, starts) {
            (None, true) => {
                self.window_order.push(key.clone());
                Some(WindowState::Open { start_ns: t })
            }
            (Some(open @ WindowState::Open { .. }), true) => Some(open),
            (Some(WindowState::Closing { start_ns, end_ns }), true) => {
                self.faults.push(FaultWindow {
                    fault: key.0.clone(),
                    target: key.1.clone(),
                    start_ns,
                    end_ns: Some(end_ns),
                });
                Some(WindowState::Open { start_ns: t })
            }
            (Some(WindowState::Open { start_ns } | WindowState::Closing { start_ns, .. }), false) => {
                Some(WindowState::Closing { start_ns, end_ns: t })
            }
            // A stop with no start (the history began mid-fault): nothing to shade.
            (None, false) => None,
        };
        if let Some(next) = next {
            self.windows.insert(key, next);
        }
    }

    /// Ends the fold: open invokes become indeterminate, open fault windows are
    /// reported as still open.
    pub fn finish(&mut self) {
        for state in self.processes.values_mut() {
            if let Some(invoke) = state.outstanding.take() {
                self.open_invokes += 1;
                if let Some(i) = invoke.order {
                    self.orders[i].unknown += 1;
                }
            }
        }
        for key in std::mem::take(&mut self.window_order) {
            if let Some(state) = self.windows.remove(&key) {
                let (start_ns, end_ns) = match state {
                    WindowState::Open { start_ns } => (start_ns, None),
                    WindowState::Closing { start_ns, end_ns } => (start_ns, Some(end_ns)),
                };
                self.faults.push(FaultWindow { fault: key.0, target: key.1, start_ns, end_ns });
            }
        }
        self.faults.sort_by_key(|w| (w.start_ns, w.fault.clone(), w.target.clone()));
    }

    pub fn order(&self, order_id: &str) -> Option<&LogicalOrder> {
        self.order_index.get(order_id).map(|&i| &self.orders[i])
    }
}

/// Folds a whole history stream.
pub fn fold(
    file: &Path,
    lines: impl Iterator<Item = Result<Line<Op>, FormatError>>,
) -> Result<HistoryFold, FormatError> {
    let mut fold = HistoryFold::default();
    for line in lines {
        match line? {
            Line::Item { line, value } => fold.push(file, line, value)?,
            Line::Truncated { .. } => fold.truncated = true,
        }
    }
    fold.finish();
    Ok(fold)
}
