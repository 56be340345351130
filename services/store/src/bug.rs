//! Bug modes: switches that put back a mistake people really make with this
//! pattern, so the harness can show that it catches each one. Every bug path in
//! the services is marked with `BUG MODE` and is off unless `--bug` names it.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The consumer applies every delivery: no inbox check.
    NoInbox,
    /// The inbox row is committed in its own transaction before the effect.
    InboxOutsideTxn,
    /// The worker acks as soon as it leases (auto-ack), then processes.
    AckBeforeProcess,
    /// The order and its message are written in two transactions.
    NonAtomicEnqueue,
    /// The projection is updated by SELECT then UPDATE instead of an atomic upsert.
    ReadModifyWriteProjection,
    /// Leases are computed from the worker's (skewable) clock.
    WorkerClockLease,
    /// Ack deletes the message whoever holds the lease.
    NoLeaseToken,
    /// A retried request gets a new event instead of the original one.
    NewEventIdOnRetry,
    /// Dead letters are deleted instead of parked.
    DlqDrop,
    /// Every session commits with `synchronous_commit = off` (PostgreSQL): an
    /// acknowledged order is lost in a database crash.
    AsyncCommit,
    /// With a broker: the relay deletes outbox rows before it publishes them,
    /// so a relay that dies in between loses them.
    RelayMarksBeforePublish,
    /// With a broker: the relay publishes without waiting for the broker's
    /// confirmation, so what a broker restart drops is gone.
    NoPublisherConfirms,
    /// With a broker that keeps each key's order: a delivery whose apply
    /// failed waits out its backoff while the deliveries behind it in its
    /// batch, of its own key among them, are applied.
    RetryAfterNext,
    /// With Kafka: the consumer commits what it received asynchronously, as
    /// it receives it, before the effect (a commit moved "off the hot
    /// path"), so a consumer that dies before the apply loses it.
    CommitAsyncOnReceipt,
}

impl Bug {
    /// The bug modes of the pipeline whatever its transport (the database
    /// queue's bug matrix runs these).
    pub const ALL: [Bug; 10] = [
        Bug::NoInbox,
        Bug::InboxOutsideTxn,
        Bug::AckBeforeProcess,
        Bug::NonAtomicEnqueue,
        Bug::ReadModifyWriteProjection,
        Bug::WorkerClockLease,
        Bug::NoLeaseToken,
        Bug::NewEventIdOnRetry,
        Bug::DlqDrop,
        Bug::AsyncCommit,
    ];

    /// The bug modes of the relay, which only a broker transport has.
    pub const RELAY: [Bug; 2] = [Bug::RelayMarksBeforePublish, Bug::NoPublisherConfirms];

    /// The bug modes that break a key's order, which only a broker that
    /// keeps one has.
    pub const ORDER: [Bug; 1] = [Bug::RetryAfterNext];

    /// The bug modes of a Kafka consumer, which commits offsets.
    pub const KAFKA: [Bug; 1] = [Bug::CommitAsyncOnReceipt];

    /// Whether this bug mode needs a broker transport (it is in the relay).
    pub fn needs_broker(self) -> bool {
        Bug::RELAY.contains(&self)
    }

    /// Whether this bug mode needs a broker that keeps each key's order.
    pub fn needs_order(self) -> bool {
        Bug::ORDER.contains(&self)
    }

    /// Whether this bug mode needs the Kafka transport (it is in its consumer).
    pub fn needs_kafka(self) -> bool {
        Bug::KAFKA.contains(&self)
    }

    /// Every bug mode: the pipeline's, the relay's, the order's, Kafka's.
    pub fn every() -> impl Iterator<Item = Bug> {
        Bug::ALL.into_iter().chain(Bug::RELAY).chain(Bug::ORDER).chain(Bug::KAFKA)
    }

    pub fn name(self) -> &'static str {
        match self {
            Bug::NoInbox => "no-inbox",
            Bug::InboxOutsideTxn => "inbox-outside-txn",
            Bug::AckBeforeProcess => "ack-before-process",
            Bug::NonAtomicEnqueue => "non-atomic-enqueue",
            Bug::ReadModifyWriteProjection => "read-modify-write-projection",
            Bug::WorkerClockLease => "worker-clock-lease",
            Bug::NoLeaseToken => "no-lease-token",
            Bug::NewEventIdOnRetry => "new-event-id-on-retry",
            Bug::DlqDrop => "dlq-drop",
            Bug::AsyncCommit => "async-commit",
            Bug::RelayMarksBeforePublish => "relay-marks-before-publish",
            Bug::NoPublisherConfirms => "no-publisher-confirms",
            Bug::RetryAfterNext => "retry-after-next",
            Bug::CommitAsyncOnReceipt => "commit-async-on-receipt",
        }
    }
}

impl fmt::Display for Bug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Bug {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Bug::every().find(|b| b.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Bug::every().map(|b| b.name()).collect();
            format!("unknown bug mode {s:?}; known: {}", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for bug in Bug::every() {
            assert_eq!(bug.name().parse::<Bug>().unwrap(), bug);
        }
        assert!("no-such-bug".parse::<Bug>().unwrap_err().contains("no-inbox"));
    }
}
