//! The values that cross the store's boundary.

use serde::{Deserialize, Serialize};

/// An order as the API accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    pub order_id: String,
    pub item_id: String,
    pub qty: i64,
    pub correlation_id: String,
    /// W3C `traceparent` of the API span, stored with the message so every
    /// delivery attempt can link to it.
    pub traceparent: Option<String>,
}

/// What `place_order` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A new order and its message were committed.
    Created { event_id: String },
    /// The same order again: nothing written, the original event returned.
    Replayed { event_id: String },
    /// The order id exists with other content: nothing written.
    Conflict { existing: StoredOrder },
}

/// A row of `orders`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredOrder {
    pub order_id: String,
    pub item_id: String,
    pub qty: i64,
    pub event_id: String,
    pub correlation_id: String,
}

/// The event a message carries: what the consumer applies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderEvent {
    pub event_id: String,
    pub order_id: String,
    pub item_id: String,
    pub qty: i64,
}

/// Message headers, stored as JSON beside the payload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers {
    pub correlation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Stamped by the relay as it publishes the message: a number that grows
    /// with each message it publishes (its clock's microseconds, kept
    /// strictly increasing across its batches and restarts while the clock
    /// does not step back). The ledger keeps it, so that an order applied
    /// before one published earlier on its key shows who reordered them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_seq: Option<i64>,
}

/// A message leased by a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    pub message_id: String,
    pub event_id: String,
    pub payload: String,
    pub headers: Headers,
    /// This delivery's number, from 1.
    pub delivery_count: i64,
    /// The token an ack or retry must present.
    pub lease_token: String,
    pub lease_until_ms: i64,
    pub enqueued_at_ms: i64,
    /// Where the lease left the message's row on PostgreSQL (its `ctid`, as
    /// text): the apply's fence and the ack find it there, without looking
    /// its id up. `None` on SQLite and for a broker's delivery, which are
    /// found by id.
    pub ctid: Option<String>,
}

impl Leased {
    pub fn event(&self) -> Result<OrderEvent, serde_json::Error> {
        serde_json::from_str(&self.payload)
    }
}

/// Which clock a lease is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseClock {
    /// The database's clock: the correct choice.
    Database,
    /// A worker's idea of now, in ms since the epoch (bug mode `worker-clock-lease`).
    Worker { now_ms: i64 },
}

/// What applying one delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// First application: the projection and the ledger were written.
    Applied { applied_at_ms: i64 },
    /// The inbox already held the event: nothing written.
    Duplicate,
    /// The lease was gone (expired and taken, or the message settled) when the
    /// transaction took the message: nothing written; its holder applies it.
    LeaseLost,
}

/// Where a batch's ack commits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AckMode {
    /// In a statement of its own after the apply's commit, as a broker's ack
    /// is: the default, because an ack lost between the two is the fault the
    /// inbox exists to absorb and haunt exists to show.
    #[default]
    Separate,
    /// In the apply's transaction: the held messages are deleted with the
    /// effect, so no ack can be lost. Only for a queue that lives in the
    /// effect's database, as this one does.
    InApplyTxn,
}

/// What `fail` did with a delivery whose processing failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// Visible again after the backoff.
    Retrying,
    /// Moved to the dead-letter table.
    DeadLettered,
    /// The caller no longer held the lease: nothing changed.
    LeaseLost,
    /// Past its last delivery, but the inbox already held its event (an ack
    /// was lost after the effect): deleted as acked, not parked.
    Settled,
}

/// The difference reconcile found for one item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Drift {
    pub item_id: String,
    pub reserved_qty: i64,
    pub expected_qty: i64,
}

/// What reconcile found (and fixed unless it was a dry run).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    pub drift: Vec<Drift>,
    /// Orders whose event was nowhere (not applied, not queued, not dead): their
    /// message was enqueued again.
    pub requeued: Vec<String>,
    pub dry_run: bool,
}

/// Queue depth by state, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub visible: i64,
    pub leased: i64,
    /// Waiting out a retry backoff.
    pub delayed: i64,
    pub dead_letter: i64,
    pub oldest_age_ms: i64,
}
