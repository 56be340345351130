//! `place_order`: one transaction, the order id as idempotency key.

use haunt_store::{LeaseClock, Placement};
use haunt_testkit::databases;
use std::time::Duration;

use crate::{count_kind, final_lines, open, order};

#[tokio::test]
async fn an_order_and_its_message_are_written_together() {
    for db in databases().await {
        let store = open(&db).await;
        let Placement::Created { event_id } = store.place_order(&order("o1", "apple", 3)).await.unwrap() else {
            panic!("{}: expected a new order", db.kind);
        };
        let stored = store.get_order("o1").await.unwrap().unwrap();
        assert_eq!((stored.item_id.as_str(), stored.qty, stored.event_id.as_str()), ("apple", 3, event_id.as_str()));
        let leased = store.lease(10, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
        assert_eq!(leased.len(), 1, "{}", db.kind);
        let event = leased[0].event().unwrap();
        assert_eq!((event.event_id, event.order_id, event.qty), (event_id, "o1".to_string(), 3));
        assert_eq!(leased[0].headers.correlation_id, "corr-o1");
        assert!(leased[0].headers.traceparent.is_some(), "the API span's traceparent rides with the message");
    }
}

#[tokio::test]
async fn a_new_store_is_empty_until_an_order() {
    for db in databases().await {
        let store = open(&db).await;
        assert!(store.is_empty().await.unwrap(), "{}", db.kind);
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        assert!(!store.is_empty().await.unwrap(), "{}", db.kind);
    }
}

#[tokio::test]
async fn the_same_order_again_replays_the_original_event() {
    for db in databases().await {
        let store = open(&db).await;
        let Placement::Created { event_id } = store.place_order(&order("o1", "apple", 3)).await.unwrap() else {
            panic!()
        };
        let again = store.place_order(&order("o1", "apple", 3)).await.unwrap();
        assert_eq!(again, Placement::Replayed { event_id }, "{}", db.kind);
        let lines = final_lines(&store).await;
        assert_eq!(count_kind(&lines, "order"), 1);
        assert_eq!(count_kind(&lines, "pending"), 1, "{}: a replay enqueues nothing", db.kind);
    }
}

#[tokio::test]
async fn the_same_order_id_with_other_content_conflicts_and_writes_nothing() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 3)).await.unwrap();
        let before = final_lines(&store).await;
        for other in [order("o1", "apple", 4), order("o1", "pear", 3)] {
            let Placement::Conflict { existing } = store.place_order(&other).await.unwrap() else {
                panic!("{}: expected a conflict", db.kind);
            };
            assert_eq!((existing.item_id.as_str(), existing.qty), ("apple", 3));
        }
        assert_eq!(final_lines(&store).await, before, "{}", db.kind);
    }
}

#[tokio::test]
async fn bug_new_event_id_on_retry_enqueues_a_second_event() {
    for db in databases().await {
        let store = crate::open_with_bug(&db, haunt_store::Bug::NewEventIdOnRetry).await;
        let Placement::Created { event_id } = store.place_order(&order("o1", "apple", 3)).await.unwrap() else {
            panic!()
        };
        let Placement::Replayed { event_id: again } = store.place_order(&order("o1", "apple", 3)).await.unwrap() else {
            panic!()
        };
        assert_ne!(event_id, again, "{}: the bug mints a new event", db.kind);
        assert_eq!(count_kind(&final_lines(&store).await, "pending"), 2);
    }
}
