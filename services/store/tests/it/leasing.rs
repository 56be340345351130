//! Leases from the database clock, apply through the inbox, ack fenced by the
//! lease token.

use std::time::Duration;

use haunt_store::{Applied, LeaseClock, Placement};
use haunt_testkit::databases;

use crate::{count_kind, final_lines, open, order};

/// Short enough to expire within a test, long enough that two statements issued
/// back to back never see it expire.
const SHORT_LEASE: Duration = Duration::from_millis(300);

#[tokio::test]
async fn a_lease_hides_the_message_until_it_expires_and_counts_deliveries() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 1)).await.unwrap();
        let before = store.now_ms().await.unwrap();
        let first = store.lease(10, SHORT_LEASE, LeaseClock::Database).await.unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].delivery_count, 1);
        let lease_ms = first[0].lease_until_ms - before;
        assert!((300..1300).contains(&lease_ms), "{}: lease from the db clock, got {lease_ms} ms", db.kind);
        assert!(store.lease(10, SHORT_LEASE, LeaseClock::Database).await.unwrap().is_empty(), "{}", db.kind);
        tokio::time::sleep(SHORT_LEASE + Duration::from_millis(100)).await;
        let second = store.lease(10, SHORT_LEASE, LeaseClock::Database).await.unwrap();
        assert_eq!(second.len(), 1, "{}: visible again after the lease expired", db.kind);
        assert_eq!(second[0].delivery_count, 2);
        assert_ne!(second[0].lease_token, first[0].lease_token);
    }
}

#[tokio::test]
async fn a_batch_is_at_most_batch_size_max() {
    for db in databases().await {
        let store = open(&db).await;
        for i in 0..7 {
            store.place_order(&order(&format!("o{i}"), "apple", 1)).await.unwrap();
        }
        let a = store.lease(5, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
        let b = store.lease(5, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
        assert_eq!((a.len(), b.len()), (5, 2), "{}", db.kind);
        let mut ids: Vec<_> = a.iter().chain(&b).map(|m| m.message_id.clone()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 7, "{}: no message leased twice", db.kind);
    }
}

#[tokio::test]
async fn apply_is_once_per_event_whatever_the_deliveries() {
    for db in databases().await {
        let store = open(&db).await;
        let Placement::Created { event_id } = store.place_order(&order("o1", "apple", 4)).await.unwrap() else {
            panic!()
        };
        // The tutorial's scenario: three deliveries, every ack lost.
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            let leased = store.lease(1, SHORT_LEASE, LeaseClock::Database).await.unwrap();
            assert_eq!(leased.len(), 1, "{}", db.kind);
            let m = &leased[0];
            outcomes.push(store.apply(m, &m.event().unwrap(), "w1").await.unwrap());
            tokio::time::sleep(SHORT_LEASE + Duration::from_millis(100)).await;
        }
        assert!(matches!(outcomes[0], Applied::Applied { .. }), "{}", db.kind);
        assert_eq!(&outcomes[1..], &[Applied::Duplicate, Applied::Duplicate], "{}", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![("apple".to_string(), 4)]);
        let lines = final_lines(&store).await;
        assert_eq!(count_kind(&lines, "applied"), 1, "{}", db.kind);
        let applied = lines.iter().find_map(|l| match l {
            haunt_format::FinalLine::Applied(a) => Some(a.clone()),
            _ => None,
        });
        let applied = applied.unwrap();
        assert_eq!((applied.event_id, applied.delivery_attempt, applied.worker_id.as_str()), (event_id, 1, "w1"));
    }
}

#[tokio::test]
async fn a_zombie_cannot_ack_a_lease_it_lost() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 1)).await.unwrap();
        let zombie = store.lease(1, SHORT_LEASE, LeaseClock::Database).await.unwrap().remove(0);
        tokio::time::sleep(SHORT_LEASE + Duration::from_millis(100)).await;
        let current = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().remove(0);
        assert!(!store.ack(&zombie.message_id, &zombie.lease_token).await.unwrap(), "{}", db.kind);
        assert_eq!(count_kind(&final_lines(&store).await, "pending"), 1, "{}: the zombie deleted nothing", db.kind);
        assert!(store.ack(&current.message_id, &current.lease_token).await.unwrap());
        assert_eq!(count_kind(&final_lines(&store).await, "pending"), 0);
    }
}

#[tokio::test]
async fn bug_no_lease_token_lets_the_zombie_ack() {
    for db in databases().await {
        let store = crate::open_with_bug(&db, haunt_store::Bug::NoLeaseToken).await;
        store.place_order(&order("o1", "apple", 1)).await.unwrap();
        let zombie = store.lease(1, SHORT_LEASE, LeaseClock::Database).await.unwrap().remove(0);
        tokio::time::sleep(SHORT_LEASE + Duration::from_millis(100)).await;
        let _current = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().remove(0);
        assert!(store.ack(&zombie.message_id, &zombie.lease_token).await.unwrap(), "{}", db.kind);
    }
}

/// The worker's ack names each message with where its lease left the row
/// (on PostgreSQL, its `ctid`). A zombie's ack finds its message leased again
/// and moved, and deletes nothing; the new holder's deletes it; under
/// `no-lease-token` the zombie's ack goes by id and deletes whoever's it is.
#[tokio::test]
async fn an_ack_by_where_the_lease_left_the_row_is_still_fenced_by_its_token() {
    for db in databases().await {
        for bug in [None, Some(haunt_store::Bug::NoLeaseToken)] {
            let store = match bug {
                None => open(&db).await,
                Some(bug) => crate::open_with_bug(&db, bug).await,
            };
            let order_id = format!("o-{bug:?}");
            store.place_order(&order(&order_id, "apple", 1)).await.unwrap();
            let zombie = store.lease(1, SHORT_LEASE, LeaseClock::Database).await.unwrap().remove(0);
            let postgres = db.kind == "postgres";
            assert_eq!(zombie.ctid.is_some(), postgres, "{}: the lease says where the row is", db.kind);
            tokio::time::sleep(SHORT_LEASE + Duration::from_millis(100)).await;
            let current = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().remove(0);
            assert_eq!(current.message_id, zombie.message_id, "{}", db.kind);
            let ack = |l: &haunt_store::Leased| vec![(l.message_id.clone(), l.ctid.clone())];
            let (zombies, currents) = (ack(&zombie), ack(&current));
            let deleted = store.ack_leased(&of(&zombies), &zombie.lease_token).await.unwrap();
            if bug.is_none() {
                assert_eq!(deleted, 0, "{}: the zombie's ack deletes nothing", db.kind);
                assert_eq!(store.ack_leased(&of(&currents), &current.lease_token).await.unwrap(), 1, "{}", db.kind);
            } else {
                assert_eq!(deleted, 1, "{}: no-lease-token: the zombie's ack deletes the message", db.kind);
            }
            assert_eq!(count_kind(&final_lines(&store).await, "pending"), 0, "{}", db.kind);
        }
    }
}

/// A worker paused past its lease wakes up and applies a message that its new
/// holder has already parked as a dead letter (delivered past the limit).
async fn zombie_applies_after_dead_letter(store: &haunt_store::Store) -> Applied {
    store.place_order(&order("o1", "apple", 3)).await.unwrap();
    let zombie = store.lease(1, SHORT_LEASE, LeaseClock::Database).await.unwrap().remove(0);
    tokio::time::sleep(SHORT_LEASE + Duration::from_millis(100)).await;
    let current = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap().remove(0);
    assert_eq!(current.delivery_count, 2);
    let parked = store.dead_letter(&current.message_id, Some(&current.lease_token), "past the limit").await.unwrap();
    assert_eq!(parked, haunt_store::Failed::DeadLettered);
    store.apply(&zombie, &zombie.event().unwrap(), "zombie").await.unwrap()
}

#[tokio::test]
async fn a_zombie_cannot_apply_a_lease_it_lost() {
    for db in databases().await {
        let store = open(&db).await;
        assert_eq!(zombie_applies_after_dead_letter(&store).await, Applied::LeaseLost, "{}", db.kind);
        let lines = final_lines(&store).await;
        assert_eq!(count_kind(&lines, "applied"), 0, "{}: the zombie wrote nothing", db.kind);
        assert_eq!(count_kind(&lines, "dead_letter"), 1, "{}", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![], "{}", db.kind);
    }
}

#[tokio::test]
async fn bug_no_lease_token_applies_a_dead_letter() {
    for db in databases().await {
        let store = crate::open_with_bug(&db, haunt_store::Bug::NoLeaseToken).await;
        let outcome = zombie_applies_after_dead_letter(&store).await;
        assert!(matches!(outcome, Applied::Applied { .. }), "{}: {outcome:?}", db.kind);
        let lines = final_lines(&store).await;
        assert_eq!(count_kind(&lines, "applied"), 1, "{}: applied and parked at once", db.kind);
        assert_eq!(count_kind(&lines, "dead_letter"), 1, "{}", db.kind);
    }
}

#[tokio::test]
async fn bug_no_inbox_applies_every_delivery() {
    for db in databases().await {
        let store = crate::open_with_bug(&db, haunt_store::Bug::NoInbox).await;
        store.place_order(&order("o1", "apple", 2)).await.unwrap();
        for _ in 0..2 {
            let m = store.lease(1, SHORT_LEASE, LeaseClock::Database).await.unwrap().remove(0);
            assert!(matches!(store.apply(&m, &m.event().unwrap(), "w1").await.unwrap(), Applied::Applied { .. }));
            tokio::time::sleep(SHORT_LEASE + Duration::from_millis(100)).await;
        }
        assert_eq!(store.projection().await.unwrap(), vec![("apple".to_string(), 4)], "{}", db.kind);
    }
}

#[tokio::test]
async fn worker_clock_leases_follow_the_given_clock() {
    for db in databases().await {
        let store = open(&db).await;
        store.place_order(&order("o1", "apple", 1)).await.unwrap();
        // A worker whose clock runs an hour ahead leases with an expiry that is
        // already past for everyone else: the message is visible again at once.
        let now = store.now_ms().await.unwrap();
        let skewed = LeaseClock::Worker { now_ms: now - 3_600_000 };
        let first = store.lease(1, Duration::from_secs(30), skewed).await.unwrap();
        assert_eq!(first.len(), 0, "{}: a clock behind the enqueue time sees nothing visible", db.kind);
        let ahead = LeaseClock::Worker { now_ms: now + 3_600_000 };
        assert_eq!(store.lease(1, Duration::from_secs(30), ahead).await.unwrap().len(), 1);
        let again = store.lease(1, Duration::from_secs(30), ahead).await.unwrap();
        assert_eq!(again.len(), 0, "{}: within the skewed clock's own lease", db.kind);
        let honest = store.lease(1, Duration::from_secs(30), LeaseClock::Database).await.unwrap();
        assert_eq!(honest.len(), 0, "{}: the skewed lease ends an hour from now", db.kind);
    }
}

/// Acks as [`haunt_store::Store::ack_leased`] takes them.
fn of(acks: &[(String, Option<String>)]) -> Vec<(&str, Option<&str>)> {
    acks.iter().map(|(id, ctid)| (id.as_str(), ctid.as_deref())).collect()
}
