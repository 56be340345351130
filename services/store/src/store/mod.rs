//! [`Store`]: the operations of the pipeline, each one transaction. This
//! file connects and holds what every operation shares; the operations live
//! beside it, one file a job:
//!
//! - [`orders`]: placing an order and reading it back;
//! - [`deliver`]: the database queue's lease, apply, ack, retry and park;
//! - [`outbox`]: the relay's lease when its broker keeps each key's order;
//! - [`repair`]: redrive, reconcile, and the helpers that break a projection;
//! - [`read`]: the projection, the queue's figures and the final state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use futures_util::future::BoxFuture;
use haunt_format::FinalLine;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AnyPool, Row};
use uuid::Uuid;

use crate::db_url::{DbKind, DbUrl};
use crate::sql::{self, Dialect};
use crate::{
    AckMode, Applied, Bug, Drift, Failed, Headers, InjectedErrors, LeaseClock, Leased, NewOrder, OrderEvent, Placement,
    QueueStats, ReconcileReport, StoreError, StoredOrder,
};

use StoreError::{CommitUnknown, NotCommitted};

mod deliver;
mod migrations;
mod orders;
mod outbox;
mod read;
mod repair;

/// Rows per multi-row statement of SQLite's redrive: 6 binds a row stays far
/// below SQLite's limit on bound parameters (32,766).
const BATCH_ROWS_MAX: usize = 1000;

#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Connections in the pool. SQLite has one writer whatever this is.
    pub max_connections: u32,
    /// How long an operation waits for a pooled connection before failing.
    pub acquire_timeout: Duration,
    /// On PostgreSQL, the lease's and the ack's commits do not wait for the
    /// WAL flush (`synchronous_commit = off` on the connections that run
    /// them); the apply's and the order's still do. Either one lost to a
    /// crash of the database only makes the message deliverable again, a
    /// redelivery the inbox absorbs, and a durable apply flushes every
    /// commit before it, so it never outlives its lease. On by default;
    /// `docs/performance.md` has the argument and the measurement.
    pub async_lease_ack: bool,
    pub bug: Option<Bug>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            // Enough for a worker's concurrency and the API's handlers on 2 cores;
            // PostgreSQL's default max_connections (100) leaves room for many.
            max_connections: 8,
            // Short, so a partitioned database turns into errors the caller can
            // report, not requests that hang past the client's timeout.
            acquire_timeout: Duration::from_secs(5),
            async_lease_ack: true,
            bug: None,
        }
    }
}

/// A connection pool and the SQL for its backend.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    /// PostgreSQL's hot path (lease, apply, ack) over sqlx's native driver,
    /// beside the `Any` pool that serves everything else: a profile of the
    /// worker found a third of its cycles in malloc and free, much of it the
    /// `Any` layer copying every row into owned `AnyValue`s and every bound
    /// string twice, and `Any` cannot bind arrays, which the one-statement
    /// apply takes. Its connections open when first needed, so a store that
    /// never leases (the API's) opens none.
    pg: Option<PgPool>,
    /// The lease's and the ack's connections on PostgreSQL with
    /// [`StoreOptions::async_lease_ack`]: `pg`'s, with asynchronous commits.
    pg_settle: Option<PgPool>,
    kind: DbKind,
    dialect: &'static Dialect,
    bug: Option<Bug>,
    injected: Arc<InjectedErrors>,
}

/// The error an injection point raises: on the near side of the commit.
fn injected() -> StoreError {
    NotCommitted(sqlx::Error::Protocol("injected fault: db-error".into()))
}

/// How long SQLite waits on a locked database before reporting busy. Writers
/// hold the lock for a millisecond or so; seconds of waiting only happen when a
/// process holding it was paused, and then failing is the honest answer.
const SQLITE_BUSY_TIMEOUT_MS: u32 = 5_000;

/// The error of a statement that commits on its own: an error the server
/// answered with means it rolled back; a connection lost on the way leaves
/// unknown whether it committed.
fn autocommitted(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::Database(_) => NotCommitted(e),
        _ => CommitUnknown(e),
    }
}

fn corrupt(table: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |e| StoreError::Corrupt { table, why: e.to_string() }
}

/// The error of a statement whose rows are decoded as they arrive: a row
/// that does not decode is corrupt, anything else happened before a commit.
fn fetched(table: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |e| match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. } => StoreError::Corrupt { table, why: e.to_string() },
        _ => NotCommitted(e),
    }
}

/// A leased message as the lease statement returns it: message id, event id,
/// payload, headers, delivery count, lease end, enqueue time, and on
/// PostgreSQL the row's address.
type LeaseRow = (String, String, String, String, i64, i64, i64, Option<String>);

/// A leased row as the lease returned it, under `token`.
fn leased(row: LeaseRow, token: &str) -> Leased {
    let (message_id, event_id, payload, headers, delivery_count, lease_until_ms, enqueued_at_ms, ctid) = row;
    Leased {
        message_id,
        event_id,
        payload,
        // Unreadable headers lose tracing, not the message.
        headers: serde_json::from_str(&headers).unwrap_or_default(),
        delivery_count,
        lease_token: token.to_owned(),
        lease_until_ms,
        enqueued_at_ms,
        ctid,
    }
}

impl Store {
    /// Connects and applies the embedded migrations.
    ///
    /// Boxed here, as the store's other entry points that the harness, the
    /// benches and the binary await (`final_state`, `reconcile`, `redrive`):
    /// an `async fn`'s body, with the sqlx code under it, is compiled again
    /// in every crate that awaits it, since release builds share no generic
    /// code between crates (docs/performance.md, the first verdict).
    pub fn connect(db: &DbUrl, options: StoreOptions) -> BoxFuture<'_, Result<Store, StoreError>> {
        Box::pin(Self::connect_unboxed(db, options))
    }

    async fn connect_unboxed(db: &DbUrl, options: StoreOptions) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let kind = db.kind();
        let url = match kind {
            // Create the file when missing.
            DbKind::Sqlite if !db.as_str().contains('?') => format!("{db}?mode=rwc"),
            _ => db.to_string(),
        };
        let connect_options = AnyConnectOptions::from_str(&url).map_err(StoreError::Connect)?;
        // BUG MODE async-commit: every session of the build commits without
        // waiting for the WAL flush, as `synchronous_commit = off` in the
        // server's configuration would. (With the orders alone asynchronous,
        // each synchronous commit of a worker flushed them too, and a crash
        // lost only what the last few milliseconds had acknowledged.)
        let async_commit = kind == DbKind::Postgres && options.bug == Some(Bug::AsyncCommit);
        let pool = AnyPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if kind == DbKind::Sqlite {
                        // WAL lets readers run beside the writer; NORMAL sync is durable
                        // across a killed process (the faults here), not a power cut.
                        sqlx::raw_sql("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL")
                            .execute(&mut *conn)
                            .await?;
                        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")))
                            .execute(&mut *conn)
                            .await?;
                    }
                    if async_commit {
                        sqlx::raw_sql("SET synchronous_commit = off").execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            })
            .connect_with(connect_options)
            .await
            .map_err(StoreError::Connect)?;
        let migrator = match kind {
            DbKind::Sqlite => &*migrations::SQLITE,
            DbKind::Postgres => &*migrations::POSTGRES,
        };
        migrator.run(&pool).await.map_err(StoreError::Migrate)?;
        let dialect = match kind {
            DbKind::Sqlite => &sql::SQLITE,
            DbKind::Postgres => &sql::POSTGRES,
        };
        let hot_path = |async_commits: bool| -> Result<PgPool, StoreError> {
            let connect =
                PgConnectOptions::from_str(&url).map_err(StoreError::Connect)?.options([("enable_nestloop", "off")]);
            let connect = if async_commits { connect.options([("synchronous_commit", "off")]) } else { connect };
            Ok(PgPoolOptions::new()
                .max_connections(options.max_connections)
                .acquire_timeout(options.acquire_timeout)
                .connect_lazy_with(connect))
        };
        // No nested loops on the hot path's connections: the one-statement
        // apply joins its steps' results (CTEs of up to a batch each), whose
        // sizes the planner cannot know (a lease token it has never seen, an
        // array parameter it guesses at ten elements), so it estimates one
        // row and loops over a batch once per row of another: 500 × 500
        // comparisons (EXPLAIN ANALYZE: 203 ms for a batch against 26 ms with
        // hash joins). The hot path's statements look rows up by key only
        // through `= ANY(array)` index conditions, never by a join, so nothing
        // here needs a nested loop. BUG MODE async-commit reaches these
        // sessions too (see above).
        let (pg, pg_settle) = match kind {
            DbKind::Postgres => {
                let apply = hot_path(async_commit)?;
                let settle = options.async_lease_ack.then(|| hot_path(true)).transpose()?;
                (Some(apply), settle)
            }
            DbKind::Sqlite => (None, None),
        };
        Ok(Store { pool, pg, pg_settle, kind, dialect, bug: options.bug, injected: Arc::default() })
    }

    /// Which database this store speaks to.
    pub fn db_kind(&self) -> DbKind {
        self.kind
    }

    pub fn bug(&self) -> Option<Bug> {
        self.bug
    }

    /// The `db-error` fault switch, shared by every clone of this store.
    pub fn injected_errors(&self) -> &Arc<InjectedErrors> {
        &self.injected
    }

    /// Opens now the connections `loops` lease loops hold at once, so that
    /// the first batches do not wait for connects: per loop, one for its lease
    /// while its last ack is in flight on another, and on PostgreSQL one to
    /// apply on (the hot path's own pool; the `Any` pool, which serves the
    /// rest, is left as it is). Each pool opens at most its size.
    pub async fn warm_loops(&self, loops: u32) -> Result<(), StoreError> {
        match (&self.pg, &self.pg_settle) {
            (Some(apply), Some(settle)) => {
                open_held(settle, 2 * loops).await?;
                open_held(apply, loops).await
            }
            (Some(pg), None) => open_held(pg, 2 * loops).await,
            _ => open_held(&self.pool, 2 * loops).await,
        }
    }

    /// Opens `n` connections of each pool now instead of on first use, and
    /// keeps them idle in the pool: the transport bench opens its consumers'
    /// pools before it starts their clock, as the server-side limit's pool is
    /// open before its clock starts.
    pub async fn warm(&self, n: u32) -> Result<(), StoreError> {
        open_held(&self.pool, n).await?;
        for pg in self.pg.iter().chain(&self.pg_settle) {
            open_held(pg, n).await?;
        }
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
        for pg in self.pg.iter().chain(&self.pg_settle) {
            pg.close().await;
        }
    }

    /// The database clock, in ms since the epoch.
    pub async fn now_ms(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar(self.dialect.now).fetch_one(&self.pool).await.map_err(NotCommitted)
    }
}

/// A batch's deliveries sorted out once its inbox insert is known.
struct Sorted<'a> {
    /// Per delivery, in batch order.
    outcomes: Vec<Applied>,
    /// The deliveries that apply their event.
    first_copies: Vec<(&'a Leased, &'a OrderEvent)>,
    /// The held deliveries the inbox absorbed.
    duplicates: Vec<(&'a Leased, &'a OrderEvent)>,
}

/// Each new event (`fresh` gives when it was processed) applies once, for
/// its first held copy in batch order (every copy with `applies_every_copy`);
/// every other held delivery is a duplicate the inbox absorbed; a delivery
/// whose message is not `held` lost its lease.
fn sort_out<'a>(
    deliveries: &[(&'a Leased, &'a OrderEvent)],
    held: impl Fn(&str) -> bool,
    fresh: impl Fn(&str) -> Option<i64>,
    applies_every_copy: bool,
) -> Sorted<'a> {
    let mut sorted = Sorted {
        outcomes: vec![Applied::LeaseLost; deliveries.len()],
        first_copies: Vec::new(),
        duplicates: Vec::new(),
    };
    let mut seen = HashSet::new();
    for (outcome, &(leased, event)) in sorted.outcomes.iter_mut().zip(deliveries) {
        if !held(&leased.message_id) {
            continue;
        }
        match fresh(&event.event_id) {
            Some(applied_at_ms) if applies_every_copy || seen.insert(event.event_id.as_str()) => {
                *outcome = Applied::Applied { applied_at_ms };
                sorted.first_copies.push((leased, event));
            }
            _ => {
                *outcome = Applied::Duplicate;
                sorted.duplicates.push((leased, event));
            }
        }
    }
    sorted
}

/// A batch's rows as the one JSON array the stepwise statements read
/// ([`Dialect::hold`] and the rest): an id per element, or a row as an array.
fn json_rows<T: serde::Serialize>(rows: &[T]) -> String {
    serde_json::to_string(rows).expect("strings and integers serialize")
}

fn count(n: i64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn event_for(new: &NewOrder, event_id: &str) -> OrderEvent {
    OrderEvent {
        event_id: event_id.to_owned(),
        order_id: new.order_id.clone(),
        item_id: new.item_id.clone(),
        qty: new.qty,
    }
}

fn stored_order(row: &AnyRow) -> Result<StoredOrder, StoreError> {
    let c = corrupt("orders");
    Ok(StoredOrder {
        order_id: row.try_get(0).map_err(&c)?,
        item_id: row.try_get(1).map_err(&c)?,
        qty: row.try_get(2).map_err(&c)?,
        event_id: row.try_get(3).map_err(&c)?,
        correlation_id: row.try_get(4).map_err(&c)?,
    })
}

async fn read_order(conn: &mut sqlx::AnyConnection, order_id: &str) -> Result<Option<StoredOrder>, StoreError> {
    let row = sqlx::query(sql::ORDER_BY_ID).bind(order_id).fetch_optional(conn).await.map_err(NotCommitted)?;
    row.as_ref().map(stored_order).transpose()
}

/// Opens `n` connections of `pool` (at most its size) together, then lets
/// them go idle in it, open.
pub(crate) async fn open_held<DB: sqlx::Database>(pool: &sqlx::Pool<DB>, n: u32) -> Result<(), StoreError> {
    let mut held = Vec::new();
    for _ in 0..n.min(pool.options().get_max_connections()) {
        held.push(pool.acquire().await.map_err(NotCommitted)?);
    }
    Ok(())
}
