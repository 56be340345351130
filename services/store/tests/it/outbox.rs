//! The relay's lease in front of a broker that keeps each key's order: the
//! outbox in the order it was written, one lease at a time, given back first.

use std::time::Duration;

use haunt_store::{Leased, Store};
use haunt_testkit::databases;

use crate::{open, order};

fn orders(batch: &[Leased]) -> Vec<String> {
    batch.iter().map(|l| l.event().unwrap().order_id).collect()
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("o{i}")).collect()
}

async fn ack(store: &Store, batch: &[Leased]) {
    let ids: Vec<&str> = batch.iter().map(|l| l.message_id.as_str()).collect();
    assert_eq!(store.ack_batch(&ids, &batch[0].lease_token).await.unwrap(), ids.len() as u64);
}

/// Thirty orders written back to back (many in one millisecond): leased in
/// the order they were written, never while a lease holds rows, and a batch
/// given back is the next lease's again, before the rows behind it; a lease
/// that runs out is too.
#[tokio::test]
async fn the_outbox_is_leased_in_the_order_it_was_written_one_lease_at_a_time() {
    for db in databases().await {
        let store = open(&db).await;
        for i in 0..30 {
            store.place_order(&order(&format!("o{i}"), &format!("item-{}", i % 2), 1)).await.unwrap();
        }
        let long = Duration::from_secs(30);
        let first = store.lease_in_order(10, long).await.unwrap();
        assert_eq!(orders(&first), names(0..10), "{}", db.kind);
        assert!(store.lease_in_order(10, long).await.unwrap().is_empty(), "{}: one lease at a time", db.kind);

        // A publish that failed: the rows come back, still first.
        assert_eq!(store.release(&first[0].lease_token).await.unwrap(), 10, "{}", db.kind);
        let again = store.lease_in_order(10, long).await.unwrap();
        assert_eq!(orders(&again), names(0..10), "{}: given back, leased first", db.kind);
        assert!(again.iter().all(|l| l.delivery_count == 2), "{}", db.kind);
        ack(&store, &again).await;

        // A relay that died holding a lease: nothing behind it until it ends.
        let short = Duration::from_millis(300);
        let dead = store.lease_in_order(10, short).await.unwrap();
        assert_eq!(orders(&dead), names(10..20), "{}", db.kind);
        assert!(store.lease_in_order(10, long).await.unwrap().is_empty(), "{}", db.kind);
        tokio::time::sleep(short + Duration::from_millis(150)).await;
        let taken_over = store.lease_in_order(20, long).await.unwrap();
        assert_eq!(orders(&taken_over), names(10..30), "{}: the dead relay's rows, then the rest", db.kind);
    }
}
