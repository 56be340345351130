//! Folds `final-state.jsonl` into lookups by order, event and item.

use std::collections::HashMap;
use std::path::Path;

use haunt_format::{Applied, DeadLetter, FinalLine, FormatError, Line, Meta, OrderRow, Pending};

#[derive(Debug, Default)]
pub struct FinalFold {
    /// In file order; a repeated order id is kept in `repeated_orders`.
    pub orders: Vec<OrderRow>,
    pub order_index: HashMap<String, usize>,
    pub repeated_orders: Vec<OrderRow>,
    /// Applied lines grouped by event, events in order of first appearance.
    pub applied: Vec<(String, Vec<Applied>)>,
    pub applied_index: HashMap<String, usize>,
    pub applied_lines: u64,
    /// Projection rows by item. A repeated item keeps its last line.
    pub projection: HashMap<String, i64>,
    pub pending: HashMap<String, Pending>,
    pub pending_lines: u64,
    pub dead_letters: HashMap<String, DeadLetter>,
    pub dead_letter_lines: u64,
    pub meta: Option<Meta>,
    pub truncated: bool,
}

impl FinalFold {
    pub fn push(&mut self, _file: &Path, _line: u64, value: FinalLine) -> Result<(), FormatError> {
        match value {
            FinalLine::Order(row) => {
                if self.order_index.contains_key(&row.order_id) {
                    self.repeated_orders.push(row);
                } else {
                    self.order_index.insert(row.order_id.clone(), self.orders.len());
                    self.orders.push(row);
                }
            }
            FinalLine::Applied(a) => {
                self.applied_lines += 1;
                match self.applied_index.get(&a.event_id) {
                    Some(&i) => self.applied[i].1.push(a),
                    None => {
                        self.applied_index.insert(a.event_id.clone(), self.applied.len());
                        self.applied.push((a.event_id.clone(), vec![a]));
                    }
                }
            }
            FinalLine::Projection(p) => {
                self.projection.insert(p.item_id, p.reserved_qty);
            }
            FinalLine::Pending(p) => {
                self.pending_lines += 1;
                self.pending.insert(p.event_id.clone(), p);
            }
            FinalLine::DeadLetter(d) => {
                self.dead_letter_lines += 1;
                self.dead_letters.insert(d.event_id.clone(), d);
            }
            FinalLine::Meta(m) => self.meta = Some(m),
        }
        Ok(())
    }

    pub fn order(&self, order_id: &str) -> Option<&OrderRow> {
        self.order_index.get(order_id).map(|&i| &self.orders[i])
    }

    pub fn applied_for(&self, event_id: &str) -> &[Applied] {
        self.applied_index.get(event_id).map(|&i| self.applied[i].1.as_slice()).unwrap_or(&[])
    }
}

pub fn fold(
    file: &Path,
    lines: impl Iterator<Item = Result<Line<FinalLine>, FormatError>>,
) -> Result<FinalFold, FormatError> {
    let mut fold = FinalFold::default();
    for line in lines {
        match line? {
            Line::Item { line, value } => fold.push(file, line, value)?,
            Line::Truncated { .. } => fold.truncated = true,
        }
    }
    Ok(fold)
}
