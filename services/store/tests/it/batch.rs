//! The batched path: one transaction per leased batch, one statement per ack.

use std::time::Duration;

use haunt_store::{AckMode, Applied, LeaseClock, Leased, OrderEvent};
use haunt_testkit::databases;

use crate::{count_kind, final_lines, open, order};

/// Runs one statement with one text parameter behind the store's back, as
/// another producer or worker would.
async fn behind_its_back(url: &str, statement: &'static str, param: &str) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(url).await.unwrap();
    sqlx::query(statement).bind(param).execute(&pool).await.unwrap();
    pool.close().await;
}

/// Makes a second queue message carrying the same event as `event_id`'s, as a
/// producer that enqueues twice would.
async fn copy_message(url: &str, event_id: &str) {
    let copy = "INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, visible_at_ms) \
         SELECT 'copy-of-' || message_id, event_id, payload, headers, enqueued_at_ms + 1, visible_at_ms \
         FROM queue_messages WHERE event_id = $1";
    behind_its_back(url, copy, event_id).await;
}

fn events(batch: &[Leased]) -> Vec<(&Leased, OrderEvent)> {
    batch.iter().map(|l| (l, l.event().unwrap())).collect()
}

/// Leases everything visible, waiting out earlier leases that were left to expire.
async fn lease_all(store: &haunt_store::Store, expect: usize) -> Vec<Leased> {
    for _ in 0..200 {
        let batch = store.lease(100, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
        if batch.len() == expect {
            return batch;
        }
        assert!(batch.is_empty(), "leased {} of {expect} at once", batch.len());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{expect} messages never became visible together");
}

#[tokio::test]
async fn a_batch_with_an_applied_event_and_two_copies_of_a_new_one_applies_the_new_one_once() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        store.place_order(&order("o2", "pear", 5)).await.unwrap();
        // o1's event is applied, but its ack is lost: its message comes back.
        let first = store.lease(100, Duration::from_millis(1), LeaseClock::Database).await.unwrap();
        let m1 = first.iter().find(|l| l.event().unwrap().order_id == "o1").unwrap();
        assert!(matches!(store.apply(m1, &m1.event().unwrap(), "w0").await.unwrap(), Applied::Applied { .. }));
        let e2 = first.iter().find(|l| l.event().unwrap().order_id == "o2").unwrap().event_id.clone();
        copy_message(&db.url, &e2).await;

        let batch = lease_all(&store, 3).await;
        let outcomes = store.apply_batch(&events(&batch), "w1").await.unwrap();
        let mut applied = 0;
        for (leased, outcome) in batch.iter().zip(&outcomes) {
            let order_id = leased.event().unwrap().order_id;
            match outcome {
                Applied::Applied { .. } => {
                    assert_eq!(order_id, "o2", "{}: only the new event applies", db.kind);
                    applied += 1;
                }
                Applied::Duplicate => {}
                Applied::LeaseLost => panic!("{}: the lease is held", db.kind),
            }
        }
        assert_eq!(applied, 1, "{}: two copies of one new event apply once: {outcomes:?}", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![("apple".into(), 3), ("pear".into(), 5)], "{}", db.kind);
        let lines = final_lines(&store).await;
        assert_eq!(count_kind(&lines, "applied"), 2, "{}: one ledger row per event", db.kind);

        let ids: Vec<&str> = batch.iter().map(|l| l.message_id.as_str()).collect();
        assert_eq!(store.ack_batch(&ids, &batch[0].lease_token).await.unwrap(), 3, "{}", db.kind);
        assert_eq!(count_kind(&final_lines(&store).await, "pending"), 0, "{}: acked in one statement", db.kind);
    }
}

#[tokio::test]
async fn a_batch_whose_lease_was_taken_over_writes_nothing_and_acks_nothing() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        store.place_order(&order("o2", "pear", 5)).await.unwrap();
        let zombie = store.lease(100, Duration::from_millis(1), LeaseClock::Database).await.unwrap();
        assert_eq!(zombie.len(), 2);
        // The lease expires; another worker takes both messages over.
        let current = lease_all(&store, 2).await;
        let outcomes = store.apply_batch(&events(&zombie), "zombie").await.unwrap();
        assert_eq!(outcomes, vec![Applied::LeaseLost, Applied::LeaseLost], "{}: a lost lease applies nothing", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![], "{}", db.kind);
        let ids: Vec<&str> = zombie.iter().map(|l| l.message_id.as_str()).collect();
        assert_eq!(store.ack_batch(&ids, &zombie[0].lease_token).await.unwrap(), 0, "{}", db.kind);
        // The current holder applies and acks them.
        let outcomes = store.apply_batch(&events(&current), "w1").await.unwrap();
        assert!(outcomes.iter().all(|o| matches!(o, Applied::Applied { .. })), "{}: {outcomes:?}", db.kind);
        let ids: Vec<&str> = current.iter().map(|l| l.message_id.as_str()).collect();
        assert_eq!(store.ack_batch(&ids, &current[0].lease_token).await.unwrap(), 2, "{}", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![("apple".into(), 3), ("pear".into(), 5)], "{}", db.kind);
    }
}

#[tokio::test]
async fn a_batch_that_lost_one_lease_of_two_applies_and_acks_only_the_other() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        store.place_order(&order("o2", "pear", 5)).await.unwrap();
        let batch = lease_all(&store, 2).await;
        let taken = batch.iter().find(|l| l.event().unwrap().order_id == "o2").unwrap();
        // Another worker holds o2's message now (its lease expired and was taken over).
        let steal = "UPDATE queue_messages SET lease_token = 'someone-else' WHERE message_id = $1";
        behind_its_back(&db.url, steal, &taken.message_id).await;
        let outcomes = store.apply_batch(&events(&batch), "w1").await.unwrap();
        for (leased, outcome) in batch.iter().zip(&outcomes) {
            match leased.event().unwrap().order_id.as_str() {
                "o1" => assert!(matches!(outcome, Applied::Applied { .. }), "{}: {outcomes:?}", db.kind),
                _ => assert_eq!(*outcome, Applied::LeaseLost, "{}: {outcomes:?}", db.kind),
            }
        }
        assert_eq!(store.projection().await.unwrap(), vec![("apple".into(), 3)], "{}", db.kind);
        let ids: Vec<&str> = batch.iter().map(|l| l.message_id.as_str()).collect();
        assert_eq!(store.ack_batch(&ids, &batch[0].lease_token).await.unwrap(), 1, "{}: only o1's", db.kind);
    }
}

#[tokio::test]
#[should_panic(expected = "one lease token")]
async fn a_batch_of_two_leases_is_a_programmer_error() {
    let db = haunt_testkit::TestDb::sqlite();
    let store = open(&db).await;
    store.place_order(&order("o1", "apple", 3)).await.unwrap();
    store.place_order(&order("o2", "pear", 5)).await.unwrap();
    let one = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
    let other = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
    let mixed = vec![(&one[0], one[0].event().unwrap()), (&other[0], other[0].event().unwrap())];
    let _ = store.apply_batch(&mixed, "w").await;
}

/// The bug modes live inside the batch path, so a batch of several deliveries
/// shows them (before, any bug mode sent every delivery one by one elsewhere).
#[tokio::test]
async fn no_inbox_applies_both_copies_in_one_batch() {
    for db in databases().await {
        let store = crate::open_with_bug(&db, haunt_store::Bug::NoInbox).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        let first = store.lease(100, Duration::from_millis(1), LeaseClock::Database).await.unwrap();
        copy_message(&db.url, &first[0].event_id).await;
        let batch = lease_all(&store, 2).await;
        let outcomes = store.apply_batch(&events(&batch), "w").await.unwrap();
        assert!(outcomes.iter().all(|o| matches!(o, Applied::Applied { .. })), "{}: {outcomes:?}", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![("apple".into(), 6)], "{}: applied twice", db.kind);
        assert_eq!(count_kind(&final_lines(&store).await, "applied"), 2, "{}", db.kind);
    }
}

#[tokio::test]
async fn inbox_outside_txn_loses_a_batch_whose_effect_failed() {
    for db in databases().await {
        let store = crate::open_with_bug(&db, haunt_store::Bug::InboxOutsideTxn).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        store.place_order(&order("o2", "pear", 5)).await.unwrap();
        let batch = lease_all(&store, 2).await;
        store.injected_errors().set_rate(1.0).unwrap();
        assert!(store.apply_batch(&events(&batch), "w").await.is_err(), "{}: the effect fails", db.kind);
        store.injected_errors().set_rate(0.0).unwrap();
        // The retry finds both events "already processed": the effects are lost.
        let outcomes = store.apply_batch(&events(&batch), "w").await.unwrap();
        assert_eq!(outcomes, vec![Applied::Duplicate, Applied::Duplicate], "{}", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![], "{}", db.kind);
    }
}

#[tokio::test]
async fn the_correct_build_applies_a_batch_whose_first_try_failed() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        store.place_order(&order("o2", "pear", 5)).await.unwrap();
        let batch = lease_all(&store, 2).await;
        store.injected_errors().set_rate(1.0).unwrap();
        assert!(store.apply_batch(&events(&batch), "w").await.is_err(), "{}", db.kind);
        store.injected_errors().set_rate(0.0).unwrap();
        let outcomes = store.apply_batch(&events(&batch), "w").await.unwrap();
        assert!(outcomes.iter().all(|o| matches!(o, Applied::Applied { .. })), "{}: {outcomes:?}", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![("apple".into(), 3), ("pear".into(), 5)], "{}", db.kind);
    }
}

/// The final state's delivery evidence: a lost ack makes a second delivery,
/// which the inbox absorbs and counts.
#[tokio::test]
async fn the_final_state_counts_each_events_deliveries_and_the_duplicates_absorbed() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        store.place_order(&order("o2", "pear", 5)).await.unwrap();
        store.place_order(&order("o3", "plum", 7)).await.unwrap();
        // o1 and o2 are applied; the acks are lost (the lease just expires).
        let first = store.lease(2, Duration::from_millis(1), LeaseClock::Database).await.unwrap();
        assert_eq!(first.len(), 2, "{}", db.kind);
        store.apply_batch(&events(&first), "w0").await.unwrap();
        // Both come back; o3 stays queued, never delivered.
        let again = lease_all(&store, 3).await;
        let redelivered: Vec<&Leased> = again.iter().filter(|l| l.delivery_count == 2).collect();
        assert_eq!(redelivered.len(), 2, "{}", db.kind);
        let pairs: Vec<(&Leased, OrderEvent)> = redelivered.iter().map(|l| (*l, l.event().unwrap())).collect();
        let outcomes = store.apply_batch(&pairs, "w1").await.unwrap();
        assert_eq!(outcomes, vec![Applied::Duplicate, Applied::Duplicate], "{}", db.kind);

        let lines = final_lines(&store).await;
        let evidence: Vec<(String, Option<u32>, Option<u32>)> = lines
            .iter()
            .filter_map(|l| match l {
                haunt_format::FinalLine::Order(o) => Some((o.order_id.clone(), o.deliveries, o.duplicates_absorbed)),
                _ => None,
            })
            .collect();
        let of = |id: &str| evidence.iter().find(|(o, _, _)| o == id).map(|(_, d, a)| (*d, *a)).unwrap();
        assert_eq!(of("o1"), (Some(2), Some(1)), "{}: delivered twice, one absorbed", db.kind);
        assert_eq!(of("o2"), (Some(2), Some(1)), "{}", db.kind);
        // o3 was leased once just now (lease_all) and never applied.
        assert_eq!(of("o3"), (Some(1), Some(0)), "{}: queued, nothing absorbed", db.kind);
    }
}

/// With the ack in the apply's transaction the held messages go with the
/// effect, duplicates included; a batch whose lease was taken over deletes
/// nothing.
#[tokio::test]
async fn a_batch_acked_in_its_apply_transaction_leaves_nothing_to_ack_and_a_zombie_deletes_nothing() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        store.place_order(&order("o2", "pear", 5)).await.unwrap();
        let zombie = store.lease(100, Duration::from_millis(1), LeaseClock::Database).await.unwrap();
        let e2 = zombie.iter().find(|l| l.event().unwrap().order_id == "o2").unwrap().event_id.clone();
        copy_message(&db.url, &e2).await;
        let current = lease_all(&store, 3).await;

        let outcomes = store.apply_batch_with(&events(&zombie), "zombie", AckMode::InApplyTxn).await.unwrap();
        assert_eq!(outcomes, vec![Applied::LeaseLost, Applied::LeaseLost], "{}", db.kind);
        assert_eq!(count_kind(&final_lines(&store).await, "pending"), 3, "{}: a zombie deletes nothing", db.kind);

        let outcomes = store.apply_batch_with(&events(&current), "w1", AckMode::InApplyTxn).await.unwrap();
        assert_eq!(outcomes.iter().filter(|o| matches!(o, Applied::Applied { .. })).count(), 2, "{}", db.kind);
        assert_eq!(outcomes.iter().filter(|o| **o == Applied::Duplicate).count(), 1, "{}: {outcomes:?}", db.kind);
        let lines = final_lines(&store).await;
        assert_eq!(count_kind(&lines, "pending"), 0, "{}: acked with the effect, copy included", db.kind);
        assert_eq!(count_kind(&lines, "applied"), 2, "{}", db.kind);
        let ids: Vec<&str> = current.iter().map(|l| l.message_id.as_str()).collect();
        assert_eq!(store.ack_batch(&ids, &current[0].lease_token).await.unwrap(), 0, "{}: nothing left", db.kind);
        let o2 = lines.iter().find_map(|l| match l {
            haunt_format::FinalLine::Order(o) if o.order_id == "o2" => Some((o.deliveries, o.duplicates_absorbed)),
            _ => None,
        });
        // Two messages of one event, each delivered twice (the zombie's lease
        // and the current one): the inbox saw delivery 2 and absorbed the copy.
        assert_eq!(o2, Some((Some(2), Some(1))), "{}", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![("apple".into(), 3), ("pear".into(), 5)], "{}", db.kind);
    }
}

/// PostgreSQL's one-statement apply runs on one snapshot. An event whose
/// inbox row another transaction commits while the statement waits on it is
/// neither new to the insert (it conflicts) nor visible to the statement's
/// read of the inbox. It must come out a duplicate, never applied, and the
/// store counts the copy after the statement. The other transaction is held
/// open until the apply is seen waiting on its inbox key, so the race is
/// made, not hoped for.
#[tokio::test]
async fn an_event_another_transaction_commits_while_the_apply_waits_is_a_counted_duplicate() {
    use sqlx::{Connection, Executor};

    let Some(db) = haunt_testkit::TestDb::postgres().await else { return };
    let store = open(&db).await;
    store.place_order(&order("o1", "apple", 3)).await.unwrap();
    let batch = store.lease(100, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
    assert_eq!(batch.len(), 1);
    let event_id = batch[0].event_id.clone();

    // Another worker's apply of a copy of the same event, not yet committed.
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    other.execute("BEGIN").await.unwrap();
    sqlx::query("INSERT INTO inbox_processed (event_id, deliveries, processed_at_ms) VALUES ($1, 1, 0)")
        .bind(&event_id)
        .execute(&mut other)
        .await
        .unwrap();

    let applying = {
        let store = store.clone();
        let batch = batch.clone();
        tokio::spawn(async move { store.apply_batch(&events(&batch), "w1").await })
    };
    let mut watch = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                   AND wait_event_type = 'Lock' AND query LIKE '%inbox_processed%'";
    let mut waited = false;
    for _ in 0..1_000 {
        if sqlx::query_scalar::<_, i64>(waiting).fetch_one(&mut watch).await.unwrap() == 1 {
            waited = true;
            break;
        }
        assert!(!applying.is_finished(), "the apply did not wait for the other transaction's inbox row");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(waited, "the apply was never seen waiting on the inbox key");
    other.execute("COMMIT").await.unwrap();

    let outcomes = applying.await.unwrap().unwrap();
    assert_eq!(outcomes, vec![Applied::Duplicate], "committed by another transaction: not applied again");
    assert_eq!(store.projection().await.unwrap(), vec![], "no effect from this apply");
    let lines = final_lines(&store).await;
    assert_eq!(count_kind(&lines, "applied"), 0, "no ledger row from this apply");
    let o1 = lines.iter().find_map(|l| match l {
        haunt_format::FinalLine::Order(o) if o.order_id == "o1" => Some((o.deliveries, o.duplicates_absorbed)),
        _ => None,
    });
    assert_eq!(o1, Some((Some(1), Some(1))), "the copy is counted on the event's inbox row");
}

/// The stepwise apply (SQLite's, and PostgreSQL's under the bug modes that
/// need the steps apart) with its ack in the transaction: a redelivered event
/// is a duplicate (the inbox insert returns only the new events), and every
/// message the batch held is deleted, whoever holds it under
/// `no-lease-token`.
#[tokio::test]
async fn the_stepwise_apply_acked_in_its_transaction_absorbs_a_redelivery_and_deletes_the_batch() {
    for db in databases().await {
        let store = crate::open_with_bug(&db, haunt_store::Bug::NoLeaseToken).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        // o1 is applied and its ack is lost: the lease just expires.
        let first = store.lease(100, Duration::from_millis(1), LeaseClock::Database).await.unwrap();
        assert_eq!(store.apply_batch(&events(&first), "w0").await.unwrap().len(), 1, "{}", db.kind);
        store.place_order(&order("o2", "pear", 5)).await.unwrap();

        let again = lease_all(&store, 2).await;
        let outcomes = store.apply_batch_with(&events(&again), "w1", AckMode::InApplyTxn).await.unwrap();
        for (leased, outcome) in again.iter().zip(&outcomes) {
            match leased.event().unwrap().order_id.as_str() {
                "o1" => assert_eq!(*outcome, Applied::Duplicate, "{}: o1 was applied before", db.kind),
                _ => assert!(matches!(outcome, Applied::Applied { .. }), "{}: o2 is new: {outcome:?}", db.kind),
            }
        }
        let lines = final_lines(&store).await;
        assert_eq!(count_kind(&lines, "pending"), 0, "{}: both deleted with the effect", db.kind);
        assert_eq!(count_kind(&lines, "applied"), 2, "{}: one ledger row per event", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![("apple".into(), 3), ("pear".into(), 5)], "{}", db.kind);
    }
}

/// Each item's applications as the ledger holds them, in ledger order.
async fn key_seqs(store: &haunt_store::Store) -> std::collections::BTreeMap<String, Vec<Option<u64>>> {
    let mut per_item = std::collections::BTreeMap::<String, Vec<Option<u64>>>::new();
    for line in final_lines(store).await {
        if let haunt_format::FinalLine::Applied(a) = line {
            per_item.entry(a.item_id).or_default().push(a.key_seq);
        }
    }
    per_item
}

/// Four workers apply batches of one item's events concurrently: each
/// item's applications are numbered 1, 2, 3… in the order the ledger took
/// them, with no gap and no number twice, on both databases; and on the
/// stepwise path of a bug mode too.
#[tokio::test(flavor = "multi_thread")]
async fn each_items_applications_are_numbered_in_commit_order_across_concurrent_batches() {
    for db in databases().await {
        let store = std::sync::Arc::new(open(&db).await);
        for i in 0..60 {
            store.place_order(&order(&format!("o{i}"), &format!("item-{}", i % 3), 1)).await.unwrap();
        }
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let store = store.clone();
                tokio::spawn(async move {
                    loop {
                        let batch = store.lease(7, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
                        if batch.is_empty() {
                            return;
                        }
                        store.apply_batch(&events(&batch), &format!("w{w}")).await.unwrap();
                        let ids: Vec<&str> = batch.iter().map(|l| l.message_id.as_str()).collect();
                        store.ack_batch(&ids, &batch[0].lease_token).await.unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.unwrap();
        }
        let seqs = key_seqs(&store).await;
        assert_eq!(seqs.len(), 3, "{}: {seqs:?}", db.kind);
        for (item, seq) in &seqs {
            let expected: Vec<Option<u64>> = (1..=20).map(Some).collect();
            assert_eq!(seq, &expected, "{}: {item}'s applications in ledger order", db.kind);
        }

        // The read-modify-write bug mode writes the projection apart from the count.
        let db2 = haunt_testkit::databases().await.into_iter().find(|d| d.kind == db.kind).unwrap();
        let buggy = crate::open_with_bug(&db2, haunt_store::Bug::ReadModifyWriteProjection).await;
        for i in 0..4 {
            buggy.place_order(&order(&format!("b{i}"), "pear", 1)).await.unwrap();
        }
        let batch = lease_all(&buggy, 4).await;
        buggy.apply_batch(&events(&batch), "w0").await.unwrap();
        assert_eq!(key_seqs(&buggy).await["pear"], vec![Some(1), Some(2), Some(3), Some(4)], "{}", db.kind);
    }
}

/// A broker's deliveries carry the relay's publish sequence in their
/// headers, and the ledger keeps it on the application of each event's
/// first copy, on both databases, in one statement (PostgreSQL) and step by
/// step (the read-modify-write bug mode, and SQLite); a delivery without
/// one (the database queue) leaves it unset.
#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_keeps_the_publish_sequence_a_delivery_carries() {
    for db in databases().await {
        for bug in [None, Some(haunt_store::Bug::ReadModifyWriteProjection)] {
            let fresh = haunt_testkit::databases().await.into_iter().find(|d| d.kind == db.kind).unwrap();
            let store = match bug {
                None => open(&fresh).await,
                Some(bug) => crate::open_with_bug(&fresh, bug).await,
            };
            for i in 0..3 {
                store.place_order(&order(&format!("o{i}"), "pear", 1)).await.unwrap();
            }
            let mut batch = lease_all(&store, 3).await;
            for (i, leased) in batch.iter_mut().enumerate().take(2) {
                leased.headers.publish_seq = Some(1_000 + i as i64);
            }
            // A second copy of the first, published again later: the first copy's counts.
            let mut copy = batch[0].clone();
            copy.headers.publish_seq = Some(5_000);
            batch.push(copy);
            let outcomes = store.apply_deliveries(&events(&batch), "w1").await.unwrap();
            assert_eq!(outcomes.iter().filter(|o| matches!(o, Applied::Applied { .. })).count(), 3, "{outcomes:?}");
            let mut seqs: Vec<(String, Option<i64>)> = final_lines(&store)
                .await
                .into_iter()
                .filter_map(|l| match l {
                    haunt_format::FinalLine::Applied(a) => Some((a.order_id, a.publish_seq)),
                    _ => None,
                })
                .collect();
            seqs.sort();
            let want = [("o0", Some(1_000)), ("o1", Some(1_001)), ("o2", None)].map(|(o, s)| (o.to_owned(), s));
            assert_eq!(seqs, want, "{} {bug:?}", db.kind);
        }
    }
}

/// The bench watches a drain by processes through the ledger's numbering and
/// then the queue's emptiness: the numbering counts every row applied, also
/// across an emptied ledger (the bench truncates between phases), and the
/// queue is empty only once the last message of the batch is acked.
#[tokio::test]
async fn the_ledger_numbering_counts_every_row_applied_and_the_queue_is_empty_after_the_last_ack() {
    for db in databases().await {
        let store = open(&db).await;
        let baseline = haunt_store::Baseline::connect(&db.url.parse().unwrap(), 2).await.unwrap();
        let before = baseline.ledger_numbered().await.unwrap();
        for (i, item) in ["apple", "pear", "apple"].iter().enumerate() {
            store.place_order(&order(&format!("o{i}"), item, 1)).await.unwrap();
        }
        let batch = lease_all(&store, 3).await;
        assert!(!store.queue_is_empty().await.unwrap(), "{}: three leased messages are still queued", db.kind);
        store.apply_batch(&events(&batch), "w1").await.unwrap();
        assert_eq!(baseline.ledger_numbered().await.unwrap() - before, 3, "{}: one ledger row per event", db.kind);
        assert!(!store.queue_is_empty().await.unwrap(), "{}: applied, not yet acked", db.kind);
        let (ids, token): (Vec<&str>, &str) =
            (batch.iter().map(|l| l.message_id.as_str()).collect(), &batch[0].lease_token);
        assert_eq!(store.ack_batch(&ids[..2], token).await.unwrap(), 2, "{}", db.kind);
        assert!(!store.queue_is_empty().await.unwrap(), "{}: one message is still unacked", db.kind);
        assert_eq!(store.ack_batch(&ids[2..], token).await.unwrap(), 1, "{}", db.kind);
        assert!(store.queue_is_empty().await.unwrap(), "{}: every message acked", db.kind);

        baseline.reset().await.unwrap();
        store.place_order(&order("o9", "plum", 1)).await.unwrap();
        let batch = lease_all(&store, 1).await;
        store.apply_batch(&events(&batch), "w1").await.unwrap();
        assert_eq!(
            baseline.ledger_numbered().await.unwrap() - before,
            4,
            "{}: the numbering goes on after the ledger is emptied",
            db.kind
        );
        baseline.close().await;
    }
}
