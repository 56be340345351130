//! The store's operations, each on SQLite and on PostgreSQL.

mod batch;
mod dead_letters;
mod leasing;
mod orders;
mod outbox;
mod reconcile;
mod redrive;

use haunt_store::{NewOrder, Store, StoreOptions};
use haunt_testkit::TestDb;

pub async fn open(db: &TestDb) -> Store {
    Store::connect(&db.url.parse().unwrap(), StoreOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", db.kind))
}

pub async fn open_with_bug(db: &TestDb, bug: haunt_store::Bug) -> Store {
    Store::connect(&db.url.parse().unwrap(), StoreOptions { bug: Some(bug), ..StoreOptions::default() }).await.unwrap()
}

pub fn order(id: &str, item: &str, qty: i64) -> NewOrder {
    NewOrder {
        order_id: id.into(),
        item_id: item.into(),
        qty,
        correlation_id: format!("corr-{id}"),
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
    }
}

/// Every line of the final state, as JSON values, for assertions.
pub async fn final_lines(store: &Store) -> Vec<haunt_format::FinalLine> {
    store.final_state_lines().await.unwrap()
}

pub fn count_kind(lines: &[haunt_format::FinalLine], kind: &str) -> usize {
    lines.iter().filter(|l| serde_json::to_value(l).unwrap()["kind"] == kind).count()
}
