//! The API over HTTP on 127.0.0.1, against a real store.

mod admin;
mod orders;
mod validation;

use haunt_api::ApiConfig;
use haunt_store::{Store, StoreOptions};
use haunt_testkit::TestDb;

#[derive(Debug)]
pub struct Api {
    pub base: String,
    pub store: Store,
    pub client: reqwest::Client,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

pub async fn start(db: &TestDb, config: ApiConfig) -> Api {
    let store = Store::connect(&db.url.parse().unwrap(), StoreOptions::default()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server_store = store.clone();
    tokio::spawn(async move {
        haunt_api::run(
            listener,
            server_store,
            config,
            Box::pin(async {
                let _ = rx.await;
            }),
        )
        .await
        .unwrap();
    });
    Api { base, store, client: reqwest::Client::new(), _shutdown: tx }
}

/// Every line of the final state, for "nothing changed" assertions.
pub async fn snapshot(store: &Store) -> Vec<haunt_format::FinalLine> {
    store.final_state_lines().await.unwrap()
}
