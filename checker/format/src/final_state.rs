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

/// A row of the source-of-truth `orders` table, with the delivery evidence
/// of its event when the system keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderRow {
    pub order_id: String,
    pub item_id: String,
    pub qty: i64,
    pub event_id: String,
    /// How many times the queue handed the order's event to a worker (0 if
    /// never). Optional: absent in run directories that do not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliveries: Option<u32>,
    /// How many of those deliveries the inbox refused as already processed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicates_absorbed: Option<u32>,
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
    /// The application's place in its item's order: strictly increasing
    /// over an item's applications in the order they committed (taken with
    /// the item's projection row). Optional: absent where the system does
    /// not number them, and on ledger rows from before haunt did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_seq: Option<u64>,
    /// When the relay published the message this application came from:
    /// a number that grows with each message the relay publishes (its
    /// clock's microseconds, kept strictly increasing), so that two of a
    /// key's messages can be told apart by which was published first.
    /// Optional: absent without a relay (the database queue) and on ledger
    /// rows from before haunt recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_seq: Option<i64>,
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
    /// Whether the system keeps a ledger of applications (`applied` lines).
    /// Absent means it does; `false`: the final state is judged from the
    /// projection alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<bool>,
    /// Messages the system still held at the read but could not name (a
    /// broker that only counts what it holds). Absent means none. While it
    /// is above 0, the rules that need every held message named
    /// (`lost-effect`, `projection-mismatch`) are not evaluated and the
    /// verdict is at best unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlisted: Option<u64>,
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

/// A final-state line borrowed from its text, every field optional: one pass,
/// no buffering of the `kind` tag. [`FinalRef::check`] enforces the fields each
/// kind requires.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FinalRef<'a> {
    #[serde(borrow)]
    pub kind: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    pub order_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    pub item_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    pub qty: Option<i64>,
    #[serde(default, borrow)]
    pub event_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    pub delivery_attempt: Option<u32>,
    #[serde(default, borrow)]
    pub worker_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    pub applied_at_ms: Option<i64>,
    /// On `applied` lines, optional: the application's place in its item's order.
    #[serde(default)]
    pub key_seq: Option<u64>,
    /// On `applied` lines, optional: when the relay published its message.
    #[serde(default)]
    pub publish_seq: Option<i64>,
    #[serde(default)]
    pub reserved_qty: Option<i64>,
    #[serde(default, borrow)]
    pub message_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    pub delivery_count: Option<u32>,
    #[serde(default, borrow)]
    pub last_error: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    pub quiesced: Option<bool>,
    #[serde(default)]
    pub read_at_ns: Option<u64>,
    #[serde(default)]
    pub run_started_at_ms: Option<i64>,
    /// On the `meta` line, optional: `false` when the system keeps no ledger.
    #[serde(default)]
    pub ledger: Option<bool>,
    /// On the `meta` line, optional: messages held but not named.
    #[serde(default)]
    pub unlisted: Option<u64>,
    /// On `order` lines, optional: how many times the queue handed the order's
    /// event to a worker (0 if never).
    #[serde(default)]
    pub deliveries: Option<u32>,
    /// On `order` lines, optional: how many of those deliveries the inbox
    /// refused as already processed.
    #[serde(default)]
    pub duplicates_absorbed: Option<u32>,
}

/// The kinds of [`FinalLine`], as written in `kind`.
pub const FINAL_KINDS: [&str; 6] = ["order", "applied", "projection", "pending", "dead_letter", "meta"];

impl FinalRef<'_> {
    /// Checks that the line's kind is known and its required fields are present.
    pub fn check(&self) -> Result<(), String> {
        let required: &[(&str, bool)] = match &*self.kind {
            "order" => &[
                ("order_id", self.order_id.is_some()),
                ("item_id", self.item_id.is_some()),
                ("qty", self.qty.is_some()),
                ("event_id", self.event_id.is_some()),
            ],
            "applied" => &[
                ("event_id", self.event_id.is_some()),
                ("order_id", self.order_id.is_some()),
                ("item_id", self.item_id.is_some()),
                ("qty", self.qty.is_some()),
                ("delivery_attempt", self.delivery_attempt.is_some()),
                ("worker_id", self.worker_id.is_some()),
                ("applied_at_ms", self.applied_at_ms.is_some()),
            ],
            "projection" => &[("item_id", self.item_id.is_some()), ("reserved_qty", self.reserved_qty.is_some())],
            "pending" => &[
                ("message_id", self.message_id.is_some()),
                ("event_id", self.event_id.is_some()),
                ("delivery_count", self.delivery_count.is_some()),
            ],
            "dead_letter" => &[
                ("message_id", self.message_id.is_some()),
                ("event_id", self.event_id.is_some()),
                ("delivery_count", self.delivery_count.is_some()),
            ],
            "meta" => &[
                ("quiesced", self.quiesced.is_some()),
                ("read_at_ns", self.read_at_ns.is_some()),
                ("run_started_at_ms", self.run_started_at_ms.is_some()),
            ],
            other => {
                return Err(format!("unknown variant `{other}`, expected one of {}", FINAL_KINDS.join(", ")));
            }
        };
        match required.iter().find(|(_, present)| !present) {
            Some((field, _)) => Err(format!("missing field `{field}` in a `{}` line", self.kind)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod ref_tests {
    use super::*;

    #[test]
    fn borrowed_lines_check_their_kind_and_fields() {
        let ok: FinalRef = serde_json::from_str(r#"{"kind":"projection","item_id":"a","reserved_qty":3}"#).unwrap();
        assert!(ok.check().is_ok());
        let missing: FinalRef =
            serde_json::from_str(r#"{"kind":"order","order_id":"o","item_id":"a","qty":1}"#).unwrap();
        assert!(missing.check().unwrap_err().contains("event_id"));
        let unknown: FinalRef = serde_json::from_str(r#"{"kind":"orders"}"#).unwrap();
        assert!(unknown.check().unwrap_err().contains("unknown variant"));
        assert!(
            serde_json::from_str::<FinalRef>(r#"{"kind":"order","qty":"2"}"#)
                .unwrap_err()
                .to_string()
                .contains("invalid type")
        );
    }
}
