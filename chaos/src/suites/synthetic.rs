//! Synthetic run directories: a valid history of N client ops over many
//! processes, with retries after indeterminate answers, and its final state.
//! For benchmarking the checker at sizes no real run reaches quickly.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use haunt_format::{
    Applied, FINAL_STATE_FILE, FinalLine, HISTORY_FILE, JsonlWriter, Meta, Op, OpType, OpValue, OrderRow, OrderValue,
    Process, ProjectionRow,
};
use haunt_store::Rng;

#[derive(Debug, Default)]
struct Clock {
    index: u64,
    time_ns: u64,
}

impl Clock {
    /// The next op's index and time: about 50 µs apart.
    fn tick(&mut self) -> (u64, u64) {
        let now = (self.index, self.time_ns);
        self.index += 1;
        self.time_ns += 50_000 + (self.index % 7) * 10_000;
        now
    }
}

/// What was written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Synthetic {
    pub ops: u64,
    pub orders: u64,
    pub applied_lines: u64,
}

/// Writes `history.jsonl` and `final-state.jsonl` with about `ops` client ops
/// into `dir`. Concurrency is simulated by interleaving `clients` processes.
pub fn write_run(dir: &Path, ops: u64, clients: u64, seed: u64) -> std::io::Result<Synthetic> {
    std::fs::create_dir_all(dir)?;
    // 8 MiB buffers: the files run to gigabytes and are written front to back.
    let mut history = JsonlWriter::new(BufWriter::with_capacity(8 << 20, File::create(dir.join(HISTORY_FILE))?));
    let mut fin = JsonlWriter::new(BufWriter::with_capacity(8 << 20, File::create(dir.join(FINAL_STATE_FILE))?));
    let mut rng = Rng::new(seed);
    let clients = clients.max(1);
    let mut process: Vec<u64> = (0..clients).collect();
    let mut next_process = clients;
    let mut projection: BTreeMap<String, i64> = BTreeMap::new();
    let mut out = Synthetic::default();
    let mut clock = Clock::default();
    let mut order_n = 0u64;
    let mut op = |history: &mut JsonlWriter<BufWriter<File>>, p: u64, kind: OpType, value: OrderValue| {
        let (index, time_ns) = clock.tick();
        let o = Op {
            index,
            time_ns,
            process: Process::Client(p),
            kind,
            f: "order".into(),
            correlation_id: Some(format!("{}-c", value.order_id)),
            value: OpValue::Order(value),
            error: (kind == OpType::Info).then(|| "timeout".to_owned()),
        };
        history.write(&o)
    };
    while out.ops < ops {
        // Two clients' ops interleave: invoke A, invoke B, complete A, complete B.
        let pair = [rng.below(clients) as usize, rng.below(clients) as usize];
        let pair: &[usize] = if pair[0] == pair[1] { &pair[..1] } else { &pair[..] };
        let mut orders = Vec::new();
        for &c in pair {
            order_n += 1;
            let order = OrderValue {
                order_id: format!("o-{order_n}"),
                item_id: format!("item-{}", rng.below(16)),
                qty: 1 + rng.below(5) as i64,
                event_id: None,
            };
            op(&mut history, process[c], OpType::Invoke, order.clone())?;
            orders.push((c, order));
        }
        for (c, order) in orders {
            let event_id = format!("e-{}", order.order_id);
            // One op in fifty times out and is retried under a new process.
            if rng.below(50) == 0 {
                op(&mut history, process[c], OpType::Info, order.clone())?;
                process[c] = next_process;
                next_process += 1;
                op(&mut history, process[c], OpType::Invoke, order.clone())?;
                out.ops += 2;
            }
            op(&mut history, process[c], OpType::Ok, OrderValue { event_id: Some(event_id.clone()), ..order.clone() })?;
            out.ops += 2;
            out.orders += 1;
            fin.write(&FinalLine::Order(OrderRow {
                order_id: order.order_id.clone(),
                item_id: order.item_id.clone(),
                qty: order.qty,
                event_id: event_id.clone(),
                // As the harness writes them: one delivery, nothing absorbed.
                deliveries: Some(1),
                duplicates_absorbed: Some(0),
            }))?;
            fin.write(&FinalLine::Applied(Applied {
                event_id,
                order_id: order.order_id.clone(),
                item_id: order.item_id.clone(),
                qty: order.qty,
                delivery_attempt: 1 + (rng.below(10) == 0) as u32,
                worker_id: format!("worker-{}", rng.below(3) + 1),
                applied_at_ms: (out.ops / 20) as i64 + 5,
                key_seq: None,
                publish_seq: None,
            }))?;
            out.applied_lines += 1;
            *projection.entry(order.item_id).or_default() += order.qty;
        }
    }
    for (item_id, reserved_qty) in projection {
        fin.write(&FinalLine::Projection(ProjectionRow { item_id, reserved_qty }))?;
    }
    fin.write(&FinalLine::Meta(Meta {
        quiesced: true,
        read_at_ns: u64::MAX / 2,
        run_started_at_ms: 0,
        ledger: None,
        unlisted: None,
    }))?;
    history.flush()?;
    fin.flush()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_synthetic_run_is_valid() {
        let dir = tempfile::tempdir().unwrap();
        let written = super::write_run(dir.path(), 5_000, 8, 1).unwrap();
        assert!(written.ops >= 5_000);
        let results = haunt_checker::check_dir(dir.path()).unwrap();
        assert_eq!(results.valid, haunt_checker::Verdict::Valid, "{:?}", results.unknown_reasons);
        assert_eq!(results.counts.acknowledged, written.orders);
        assert!(results.counts.ops >= 5_000);
    }
}
