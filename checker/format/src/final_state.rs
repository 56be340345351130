//! One line of `final-state.jsonl`: the system as read after heal and quiesce.

use serde::{Deserialize, Serialize};

/// A line of the final state, told apart by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FinalLine {
    Order(OrderRow),
    Applied(Applied),
    Projection(ProjectionRow),
    Pending(Pending),
    DeadLetter(DeadLetter),
    Meta(Meta),
}

/// A row of the source-of-truth `orders` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderRow {
    pub order_id: String,
    pub item_id: String,
    pub qty: i64,
    pub event_id: String,
}

/// One application of an event to the projection (a projection ledger row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub event_id: String,
    pub order_id: String,
    pub item_id: String,
    pub qty: i64,
    pub delivery_attempt: u32,
    pub worker_id: String,
    pub applied_at_ms: i64,
}

/// A row of the projection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectionRow {
    pub item_id: String,
    pub reserved_qty: i64,
}

/// A message still in the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub message_id: String,
    pub event_id: String,
    pub delivery_count: u32,
}

/// A message parked in the dead-letter table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub message_id: String,
    pub event_id: String,
    pub delivery_count: u32,
    #[serde(default)]
    pub last_error: Option<String>,
}

/// How and when the final state was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The queue drained before the read.
    pub quiesced: bool,
    pub read_at_ns: u64,
    /// Unix time in ms at the history's `time_ns` 0.
    pub run_started_at_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_told_apart_by_kind() {
        let line = r#"{"kind":"dead_letter","message_id":"m","event_id":"e","delivery_count":5,"last_error":"boom"}"#;
        let parsed: FinalLine = serde_json::from_str(line).unwrap();
        assert!(matches!(parsed, FinalLine::DeadLetter(ref d) if d.delivery_count == 5));
        assert_eq!(serde_json::to_string(&parsed).unwrap(), line);
    }

    #[test]
    fn unknown_kind_is_rejected() {
        assert!(serde_json::from_str::<FinalLine>(r#"{"kind":"orders"}"#).is_err());
    }
}
