//! Retries with backoff, dead letters, redrive.

use std::time::Duration;

use haunt_store::{Failed, LeaseClock};
use haunt_testkit::databases;

use crate::{count_kind, final_lines, open, order};

#[tokio::test]
async fn a_failed_delivery_comes_back_after_its_backoff() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 1)).await.unwrap();
        let m = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().remove(0);
        let outcome = store.fail(&m, "boom", Duration::from_millis(400), 5).await.unwrap();
        assert_eq!(outcome, Failed::Retrying);
        assert!(store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().is_empty(), "{}", db.kind);
        let stats = store.queue_stats().await.unwrap();
        assert_eq!((stats.visible, stats.leased, stats.delayed), (0, 0, 1), "{}", db.kind);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let again = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
        assert_eq!(again.len(), 1, "{}", db.kind);
        assert_eq!(again[0].delivery_count, 2);
    }
}

#[tokio::test]
async fn after_the_last_allowed_delivery_it_is_dead_lettered_then_redriven() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 1)).await.unwrap();
        let max = 3;
        let mut outcomes = Vec::new();
        for _ in 0..max {
            let m = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().remove(0);
            outcomes.push(store.fail(&m, &format!("boom {}", m.delivery_count), Duration::ZERO, max).await.unwrap());
        }
        assert_eq!(outcomes, vec![Failed::Retrying, Failed::Retrying, Failed::DeadLettered], "{}", db.kind);
        let lines = final_lines(&store).await;
        assert_eq!((count_kind(&lines, "pending"), count_kind(&lines, "dead_letter")), (0, 1), "{}", db.kind);
        let dead = lines.iter().find_map(|l| match l {
            haunt_format::FinalLine::DeadLetter(d) => Some(d.clone()),
            _ => None,
        });
        let dead = dead.unwrap();
        assert_eq!((dead.delivery_count, dead.last_error.as_deref()), (3, Some("boom 3")));
        assert_eq!(store.queue_stats().await.unwrap().dead_letter, 1);

        assert_eq!(store.redrive(None).await.unwrap(), 1);
        let m = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
        assert_eq!(m.len(), 1, "{}: redriven messages are visible at once", db.kind);
        assert_eq!(m[0].delivery_count, 1, "{}: redrive starts the count afresh", db.kind);
        assert_eq!(count_kind(&final_lines(&store).await, "dead_letter"), 0);
    }
}

#[tokio::test]
async fn a_lost_lease_cannot_be_failed_or_dead_lettered() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 1)).await.unwrap();
        let zombie = store.lease(1, Duration::from_millis(200), LeaseClock::Database).await.unwrap().remove(0);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _current = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().remove(0);
        assert_eq!(store.fail(&zombie, "late", Duration::ZERO, 5).await.unwrap(), Failed::LeaseLost, "{}", db.kind);
        assert_eq!(store.fail(&zombie, "late", Duration::ZERO, 1).await.unwrap(), Failed::LeaseLost, "{}", db.kind);
        let stats = store.queue_stats().await.unwrap();
        assert_eq!((stats.leased, stats.dead_letter), (1, 0), "{}", db.kind);
    }
}

#[tokio::test]
async fn a_message_whose_event_was_applied_is_acked_not_parked() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 2)).await.unwrap();
        // Applied on its first delivery, and the ack lost.
        let first = store.lease(1, Duration::from_millis(100), LeaseClock::Database).await.unwrap().remove(0);
        let applied = store.apply(&first, &first.event().unwrap(), "w1").await.unwrap();
        assert!(matches!(applied, haunt_store::Applied::Applied { .. }), "{}", db.kind);
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Delivered again, past the limit: settled, not parked.
        let again = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().remove(0);
        let outcome = store.dead_letter(&again.message_id, Some(&again.lease_token), "past the limit").await.unwrap();
        assert_eq!(outcome, Failed::Settled, "{}", db.kind);
        let lines = final_lines(&store).await;
        assert_eq!((count_kind(&lines, "dead_letter"), count_kind(&lines, "pending")), (0, 0), "{}", db.kind);
        assert_eq!(count_kind(&lines, "applied"), 1, "{}", db.kind);
    }
}
