//! A system under test kept in memory, for runs in process and in virtual
//! time: each order is applied once, unless it is told to break.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use haunt_chaos::core::roles::{BoxFuture, Client, Completion, NoopBackend};
use haunt_chaos::core::system::{FinalSink, Surfaces, System};
use haunt_format::{Applied, FinalLine, OrderRow, OrderValue, ProjectionRow};

/// Orders kept in memory, each applied once: a correct system, unless
/// `doubles` says to apply every n-th order twice, or `doubling` is set
/// while an order is placed (that order is then applied twice).
#[derive(Debug)]
pub struct Memory {
    pub surfaces: Surfaces,
    pub orders: Arc<Mutex<BTreeMap<String, OrderRow>>>,
    pub doubles: Option<usize>,
    /// While set, each new order is applied twice: a fault a nemesis flips.
    pub doubling: Arc<AtomicBool>,
    /// The orders placed while `doubling` was set.
    pub doubled: Arc<Mutex<BTreeSet<String>>>,
}

impl Memory {
    pub fn new() -> Memory {
        Memory {
            surfaces: Surfaces::nodes_only(Arc::new(NoopBackend)),
            orders: Arc::default(),
            doubles: None,
            doubling: Arc::default(),
            doubled: Arc::default(),
        }
    }
}

#[derive(Debug)]
struct MemoryClient {
    orders: Arc<Mutex<BTreeMap<String, OrderRow>>>,
    doubling: Arc<AtomicBool>,
    pub doubled: Arc<Mutex<BTreeSet<String>>>,
}

impl Client for MemoryClient {
    fn place<'a>(&'a self, order: &'a OrderValue, _correlation_id: &'a str) -> BoxFuture<'a, Completion> {
        Box::pin(async move {
            let mut orders = self.orders.lock().unwrap();
            let row = orders.entry(order.order_id.clone()).or_insert_with(|| {
                if self.doubling.load(Ordering::SeqCst) {
                    self.doubled.lock().unwrap().insert(order.order_id.clone());
                }
                OrderRow {
                    order_id: order.order_id.clone(),
                    item_id: order.item_id.clone(),
                    qty: order.qty,
                    event_id: format!("e-{}", order.order_id),
                    ..OrderRow::default()
                }
            });
            Completion::Ok { event_id: Some(row.event_id.clone()) }
        })
    }
}

impl System for Memory {
    fn surfaces(&self) -> &Surfaces {
        &self.surfaces
    }
    fn client(&self) -> Arc<dyn Client> {
        Arc::new(MemoryClient {
            orders: self.orders.clone(),
            doubling: self.doubling.clone(),
            doubled: self.doubled.clone(),
        })
    }
    fn ready(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn is_quiet(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(async { Ok(true) })
    }
    fn read_final_state<'a>(&'a self, sink: &'a mut FinalSink<'_>) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let orders = self.orders.lock().unwrap().clone();
            let doubled = self.doubled.lock().unwrap().clone();
            let mut reserved: BTreeMap<String, i64> = BTreeMap::new();
            for (i, row) in orders.values().enumerate() {
                let twice = self.doubles.is_some_and(|n| i % n == 0) || doubled.contains(&row.order_id);
                sink(FinalLine::Order(row.clone()))?;
                for attempt in 1..=(if twice { 2 } else { 1 }) {
                    *reserved.entry(row.item_id.clone()).or_default() += row.qty;
                    sink(FinalLine::Applied(Applied {
                        event_id: row.event_id.clone(),
                        order_id: row.order_id.clone(),
                        item_id: row.item_id.clone(),
                        qty: row.qty,
                        delivery_attempt: attempt,
                        worker_id: "memory".into(),
                        applied_at_ms: 0,
                        key_seq: None,
                        publish_seq: None,
                    }))?;
                }
            }
            for (item_id, reserved_qty) in reserved {
                sink(FinalLine::Projection(ProjectionRow { item_id, reserved_qty }))?;
            }
            Ok(())
        })
    }
    fn database(&self) -> String {
        "memory".into()
    }
}
