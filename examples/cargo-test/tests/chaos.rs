//! Chaos tests of a pipeline whose containers the test starts itself.
//!
//! Each test starts a shop (PostgreSQL, an API, two workers) under
//! testcontainers, hands the containers to haunt, which runs a seeded
//! workload against them for 20 s while it kills, pauses and partitions them,
//! and then checks from the history and the database that no acknowledged
//! order was lost and no event applied twice.

mod shop;

use std::time::Duration;

use haunt_chaos::test::{ChaosTest, Fault, Outcome};

use shop::{Shop, ShopOptions};

/// 20 s of orders under kills, pauses and partitions, a fault every 1.5 s.
async fn chaos(shop: &Shop, seed: u64) -> Outcome {
    ChaosTest::system_toml(&shop.system())
        .faults(&[Fault::Kill, Fault::Pause, Fault::Partition])
        .time_limit(Duration::from_secs(20))
        .fault_interval(Duration::from_millis(1500))
        // The workers' lease; a paused worker is held past it, so its
        // messages go to the other worker while it sleeps.
        .options(|o| o.visibility_timeout = Duration::from_secs(1))
        .seed(seed)
        .store(concat!(env!("CARGO_MANIFEST_DIR"), "/target/haunt-store"))
        .run()
        .await
        .expect("the run could be checked")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shop_loses_no_order_and_applies_none_twice_under_kills_pauses_and_partitions() {
    let shop = Shop::start("valid", ShopOptions::default()).await;
    let outcome = chaos(&shop, 7).await;
    outcome.assert_valid();
    // A run whose faults did nothing proves nothing: they happened.
    let fired: Vec<&str> = outcome.results.faults.iter().map(|w| w.fault.as_str()).collect();
    for fault in ["kill", "pause", "partition"] {
        assert!(fired.contains(&fault), "no {fault} happened: {fired:?}");
    }
}

/// The same shop with a known mistake: its workers apply without the inbox,
/// and lose one ack in ten, so redelivered events are applied again.
#[tokio::test(flavor = "multi_thread")]
async fn a_shop_without_an_inbox_is_caught_applying_events_twice() {
    let options = ShopOptions { bug: Some("no-inbox"), ack_fail_rate: Some(0.1), ..ShopOptions::default() };
    let shop = Shop::start("no-inbox", options).await;
    let outcome = chaos(&shop, 7).await;
    // What `assert_valid` would have said, for a reader of this example.
    println!("{}", outcome.explain());
    outcome.assert_anomaly("double-applied");
}
