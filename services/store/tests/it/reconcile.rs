//! Reconcile rebuilds the projection from the orders.

use std::time::Duration;

use haunt_store::{Bug, Drift, LeaseClock};
use haunt_testkit::databases;

use crate::{open, open_with_bug, order};

async fn apply_all(store: &haunt_store::Store) {
    loop {
        let batch = store.lease(100, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
        if batch.is_empty() {
            return;
        }
        for m in batch {
            store.apply(&m, &m.event().unwrap(), "w").await.unwrap();
            store.ack(&m.message_id, &m.lease_token).await.unwrap();
        }
    }
}

#[tokio::test]
async fn reconcile_reports_and_repairs_drift() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 2)).await.unwrap();
        store.place_order(&order("o2", "apple", 3)).await.unwrap();
        store.place_order(&order("o3", "pear", 1)).await.unwrap();
        apply_all(&store).await;
        assert!(store.reconcile(false).await.unwrap().drift.is_empty(), "{}: no drift to begin with", db.kind);

        store.corrupt_projection("apple", 7).await.unwrap();
        store.corrupt_projection("ghost", 1).await.unwrap();
        let want = vec![
            Drift { item_id: "apple".into(), reserved_qty: 12, expected_qty: 5 },
            Drift { item_id: "ghost".into(), reserved_qty: 1, expected_qty: 0 },
        ];
        let dry = store.reconcile(true).await.unwrap();
        assert_eq!(dry.drift, want, "{}", db.kind);
        assert!(
            store.projection().await.unwrap().contains(&("apple".into(), 12)),
            "{}: dry run changes nothing",
            db.kind
        );

        let fixed = store.reconcile(false).await.unwrap();
        assert_eq!(fixed.drift, want);
        let projection = store.projection().await.unwrap();
        assert_eq!(projection, vec![("apple".into(), 5), ("ghost".into(), 0), ("pear".into(), 1)], "{}", db.kind);
        assert!(store.reconcile(false).await.unwrap().drift.is_empty());
    }
}

#[tokio::test]
async fn reconcile_leaves_queued_events_to_the_workers() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 2)).await.unwrap();
        // Not applied yet: the projection is not behind, the event is on its way.
        let report = store.reconcile(false).await.unwrap();
        assert!(report.drift.is_empty() && report.requeued.is_empty(), "{}: {report:?}", db.kind);
        apply_all(&store).await;
        assert_eq!(store.projection().await.unwrap(), vec![("apple".into(), 2)]);
    }
}

#[tokio::test]
async fn reconcile_requeues_an_order_whose_event_was_lost() {
    for db in databases().await {
        // dlq-drop deletes the message: the order is left with its event nowhere.
        let store = open_with_bug(&db, Bug::DlqDrop).await;
        store.place_order(&order("o1", "apple", 2)).await.unwrap();
        let m = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().remove(0);
        store.fail(&m, "poison", Duration::ZERO, 1).await.unwrap();
        assert_eq!(store.queue_stats().await.unwrap().dead_letter, 0, "{}: the bug drops it", db.kind);
        let report = store.reconcile(false).await.unwrap();
        assert_eq!(report.requeued, vec!["o1".to_string()], "{}", db.kind);
        apply_all(&store).await;
        assert_eq!(store.projection().await.unwrap(), vec![("apple".into(), 2)], "{}", db.kind);
    }
}
