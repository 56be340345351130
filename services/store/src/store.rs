//! [`Store`]: the operations of the pipeline, each one transaction.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::TryStreamExt;
use haunt_format::FinalLine;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AnyPool, Row};
use uuid::Uuid;

use crate::sql::{self, Dialect};
use crate::{
    AckMode, Applied, Bug, Drift, Failed, Headers, InjectedErrors, LeaseClock, Leased, NewOrder, OrderEvent, Placement,
    QueueStats, ReconcileReport, StoreError, StoredOrder,
};

use StoreError::{CommitUnknown, NotCommitted};

/// Rows per multi-row statement of SQLite's redrive: 6 binds a row stays far
/// below SQLite's limit on bound parameters (32,766).
const BATCH_ROWS_MAX: usize = 1000;

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn from_url(url: &str) -> Result<Backend, StoreError> {
        if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else {
            Err(StoreError::Url(url.to_owned()))
        }
    }
}

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
    backend: Backend,
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
/// payload, headers, delivery count, lease end, enqueue time.
type LeaseRow = (String, String, String, String, i64, i64, i64);

impl Store {
    /// Connects and applies the embedded migrations.
    pub async fn connect(url: &str, options: StoreOptions) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::from_url(url)?;
        let url = match backend {
            // Create the file when missing.
            Backend::Sqlite if !url.contains('?') => format!("{url}?mode=rwc"),
            _ => url.to_owned(),
        };
        let connect_options = AnyConnectOptions::from_str(&url).map_err(StoreError::Connect)?;
        // BUG MODE async-commit: every session of the build commits without
        // waiting for the WAL flush, as `synchronous_commit = off` in the
        // server's configuration would. (With the orders alone asynchronous,
        // each synchronous commit of a worker flushed them too, and a crash
        // lost only what the last few milliseconds had acknowledged.)
        let async_commit = backend == Backend::Postgres && options.bug == Some(Bug::AsyncCommit);
        let pool = AnyPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
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
        let migrator = match backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        migrator.run(&pool).await.map_err(StoreError::Migrate)?;
        let dialect = match backend {
            Backend::Sqlite => &sql::SQLITE,
            Backend::Postgres => &sql::POSTGRES,
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
        let (pg, pg_settle) = match backend {
            Backend::Postgres => {
                let apply = hot_path(async_commit)?;
                let settle = options.async_lease_ack.then(|| hot_path(true)).transpose()?;
                (Some(apply), settle)
            }
            Backend::Sqlite => (None, None),
        };
        Ok(Store { pool, pg, pg_settle, backend, dialect, bug: options.bug, injected: Arc::default() })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn bug(&self) -> Option<Bug> {
        self.bug
    }

    /// The `db-error` fault switch, shared by every clone of this store.
    pub fn injected_errors(&self) -> &Arc<InjectedErrors> {
        &self.injected
    }

    /// Opens `n` connections of each pool now instead of on first use, and
    /// keeps them idle in the pool: the pipeline bench opens its workers'
    /// pools before it starts their clock, as the server-side limit's pool
    /// is open before its clock starts.
    pub async fn warm(&self, n: u32) -> Result<(), StoreError> {
        let mut held = Vec::new();
        for _ in 0..n {
            held.push(self.pool.acquire().await.map_err(NotCommitted)?);
        }
        for pg in self.pg.iter().chain(&self.pg_settle) {
            let mut held = Vec::new();
            for _ in 0..n {
                held.push(pg.acquire().await.map_err(NotCommitted)?);
            }
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

    /// Writes the order and its message in one transaction. The order id is the
    /// idempotency key: the same order again is a replay, other content a conflict.
    pub async fn place_order(&self, new: &NewOrder) -> Result<Placement, StoreError> {
        let event_id = Uuid::new_v4().to_string();
        if self.backend == Backend::Postgres && !matches!(self.bug, Some(Bug::AsyncCommit | Bug::NonAtomicEnqueue)) {
            return self.place_order_in_one_statement(new, event_id).await;
        }
        // BUG MODE async-commit runs here too, on a session that commits
        // asynchronously (see `connect`): an acknowledged order can vanish in a
        // database crash.
        let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
        let inserted = sqlx::query(self.dialect.place_order)
            .bind(&new.order_id)
            .bind(&new.item_id)
            .bind(new.qty)
            .bind(&event_id)
            .bind(&new.correlation_id)
            .execute(&mut *tx)
            .await
            .map_err(NotCommitted)?
            .rows_affected();
        if inserted == 0 {
            let existing = read_order(&mut tx, &new.order_id).await?;
            // Nothing was written; a failed rollback only ends the transaction sooner.
            let _ = tx.rollback().await;
            return self.replay(new, existing).await;
        }
        let event = event_for(new, &event_id);
        if self.bug == Some(Bug::NonAtomicEnqueue) {
            // BUG MODE non-atomic-enqueue: the order commits on its own; if the
            // message insert then fails, the order exists with no event, and the
            // caller is told the request failed.
            tx.commit().await.map_err(CommitUnknown)?;
            let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
            self.enqueue(&mut tx, new, &event).await?;
            tx.commit().await.map_err(NotCommitted)?;
            return Ok(Placement::Created { event_id });
        }
        self.enqueue(&mut tx, new, &event).await?;
        tx.commit().await.map_err(CommitUnknown)?;
        Ok(Placement::Created { event_id })
    }

    /// `place_order` on PostgreSQL: one statement writes the order and its
    /// message, or, for an order id already taken, nothing.
    async fn place_order_in_one_statement(&self, new: &NewOrder, event_id: String) -> Result<Placement, StoreError> {
        if self.injected.roll() {
            return Err(injected());
        }
        let event = event_for(new, &event_id);
        let payload = serde_json::to_string(&event).expect("an event serializes");
        let headers = Headers { correlation_id: new.correlation_id.clone(), traceparent: new.traceparent.clone() };
        let headers = serde_json::to_string(&headers).expect("headers serialize");
        let mut conn = self.pool.acquire().await.map_err(NotCommitted)?;
        let enqueued = sqlx::query(sql::PLACE_ORDER_AND_ENQUEUE_POSTGRES)
            .bind(&new.order_id)
            .bind(&new.item_id)
            .bind(new.qty)
            .bind(&event_id)
            .bind(&new.correlation_id)
            .bind(Uuid::new_v4().to_string())
            .bind(payload)
            .bind(headers)
            .execute(&mut *conn)
            .await
            .map_err(autocommitted)?
            .rows_affected();
        drop(conn);
        if enqueued == 1 {
            return Ok(Placement::Created { event_id });
        }
        let existing = self.get_order(&new.order_id).await?;
        self.replay(new, existing).await
    }

    /// A retried order id: the original event, unless the content differs.
    async fn replay(&self, new: &NewOrder, existing: Option<StoredOrder>) -> Result<Placement, StoreError> {
        let existing = existing.ok_or_else(|| StoreError::Corrupt {
            table: "orders",
            why: format!("order {} conflicted but cannot be read", new.order_id),
        })?;
        if existing.item_id != new.item_id || existing.qty != new.qty {
            return Ok(Placement::Conflict { existing });
        }
        if self.bug == Some(Bug::NewEventIdOnRetry) {
            // BUG MODE new-event-id-on-retry: a retried request enqueues a fresh
            // event instead of answering with the original one.
            let fresh = OrderEvent { event_id: Uuid::new_v4().to_string(), ..event_for(new, &existing.event_id) };
            let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
            self.enqueue(&mut tx, new, &fresh).await?;
            tx.commit().await.map_err(CommitUnknown)?;
            return Ok(Placement::Replayed { event_id: fresh.event_id });
        }
        Ok(Placement::Replayed { event_id: existing.event_id })
    }

    async fn enqueue(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        new: &NewOrder,
        event: &OrderEvent,
    ) -> Result<(), StoreError> {
        if self.injected.roll() {
            return Err(injected());
        }
        let payload = serde_json::to_string(event).expect("an event serializes");
        let headers = Headers { correlation_id: new.correlation_id.clone(), traceparent: new.traceparent.clone() };
        let headers = serde_json::to_string(&headers).expect("headers serialize");
        sqlx::query(self.dialect.enqueue)
            .bind(Uuid::new_v4().to_string())
            .bind(&event.event_id)
            .bind(payload)
            .bind(headers)
            .execute(&mut **tx)
            .await
            .map_err(NotCommitted)?;
        Ok(())
    }

    pub async fn get_order(&self, order_id: &str) -> Result<Option<StoredOrder>, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(NotCommitted)?;
        read_order(&mut conn, order_id).await
    }

    /// Leases up to `batch_size_max` visible messages for `visibility_timeout`.
    /// Each delivery's count goes up by one and all share a fresh lease token.
    pub async fn lease(
        &self,
        batch_size_max: u32,
        visibility_timeout: Duration,
        clock: LeaseClock,
    ) -> Result<Vec<Leased>, StoreError> {
        let token = Uuid::new_v4().to_string();
        let now = match clock {
            LeaseClock::Database => None,
            LeaseClock::Worker { now_ms } => Some(now_ms),
        };
        let batch_size_max = i64::from(batch_size_max);
        let visibility_timeout_ms = visibility_timeout.as_millis() as i64;
        macro_rules! leased_rows {
            ($pool:expr) => {
                sqlx::query_as::<_, LeaseRow>(self.dialect.lease)
                    .bind(batch_size_max)
                    .bind(now)
                    .bind(&token)
                    .bind(visibility_timeout_ms)
                    .fetch_all($pool)
                    .await
                    .map_err(fetched("queue_messages"))?
            };
        }
        let rows = match self.pg_settle.as_ref().or(self.pg.as_ref()) {
            Some(pg) => leased_rows!(pg),
            None => leased_rows!(&self.pool),
        };
        let mut leased: Vec<Leased> = rows
            .into_iter()
            .map(|(message_id, event_id, payload, headers, delivery_count, lease_until_ms, enqueued_at_ms)| Leased {
                message_id,
                event_id,
                payload,
                // Unreadable headers lose tracing, not the message.
                headers: serde_json::from_str(&headers).unwrap_or_default(),
                delivery_count,
                lease_token: token.clone(),
                lease_until_ms,
                enqueued_at_ms,
            })
            .collect();
        leased.sort_by_key(|m| m.enqueued_at_ms);
        Ok(leased)
    }

    /// Whether an apply first makes sure its lease still holds the message. Not
    /// without lease tokens, and not after an auto-ack (the message is gone).
    fn fences_apply(&self) -> bool {
        !matches!(self.bug, Some(Bug::NoLeaseToken) | Some(Bug::AckBeforeProcess))
    }

    /// The token a settling statement must match: none under `no-lease-token`.
    fn holder<'a>(&self, lease_token: Option<&'a str>) -> Option<&'a str> {
        // BUG MODE no-lease-token: ack, retry and dead-letter act on whoever holds the message.
        if self.bug == Some(Bug::NoLeaseToken) { None } else { lease_token }
    }

    /// Applies one delivery: a batch of one (see [`Store::apply_batch`]).
    pub async fn apply(&self, leased: &Leased, event: &OrderEvent, worker_id: &str) -> Result<Applied, StoreError> {
        let mut outcomes = self.apply_batch(&[(leased, event.clone())], worker_id).await?;
        Ok(outcomes.pop().expect("one outcome per delivery"))
    }

    /// Applies the deliveries of one lease in one transaction: it takes the rows
    /// the lease still holds, inserts the batch into the inbox at once
    /// (conflicts are the duplicates, within the batch as across batches, and
    /// are counted on the inbox row), then upserts the projection once per item
    /// with the sum of the new events and writes their ledger rows. Returns,
    /// per delivery and in order, what happened (`LeaseLost` for a message the
    /// lease no longer held).
    ///
    /// This is the only apply path: one delivery is a batch of one, and every
    /// bug mode that concerns applying is a switch in here, so the bug matrix
    /// runs the code that runs by default.
    ///
    /// # Panics
    ///
    /// If the deliveries carry more than one lease token: a batch is one lease.
    pub async fn apply_batch(
        &self,
        batch: &[(&Leased, OrderEvent)],
        worker_id: &str,
    ) -> Result<Vec<Applied>, StoreError> {
        self.apply_batch_with(batch, worker_id, AckMode::Separate).await
    }

    /// [`Store::apply_batch`], and with [`AckMode::InApplyTxn`] the held
    /// messages deleted in the same transaction (no ack to send after).
    ///
    /// On PostgreSQL, unless a bug mode that concerns applying is on, the
    /// whole transaction is one statement ([`sql::APPLY_BATCH_POSTGRES`]):
    /// the same steps in the same order, one round trip. SQLite, which has
    /// no round trips to save, and those bug modes, whose switches sit
    /// between the steps, run the steps one statement at a time.
    ///
    /// # Panics
    ///
    /// If the deliveries carry more than one lease token: a batch is one lease.
    pub async fn apply_batch_with(
        &self,
        batch: &[(&Leased, OrderEvent)],
        worker_id: &str,
        ack: AckMode,
    ) -> Result<Vec<Applied>, StoreError> {
        let Some((first, _)) = batch.first() else {
            return Ok(Vec::new());
        };
        let token = first.lease_token.as_str();
        assert!(batch.iter().all(|(l, _)| l.lease_token == token), "a batch is one lease, with one lease token");
        let fence = self.fences_apply().then_some(token);
        self.apply_fenced(batch, fence, worker_id, ack).await
    }

    /// Applies deliveries a broker made: the same transaction as
    /// [`Store::apply_batch`], without the lease fence and without an ack.
    /// The broker holds the lease (a delivery tag, a pending entry, a
    /// visibility timeout), so a zombie's copy reaches the inbox and is
    /// counted there as a duplicate, not stopped at a fence. Their
    /// `lease_token` is not read.
    pub async fn apply_deliveries(
        &self,
        batch: &[(&Leased, OrderEvent)],
        worker_id: &str,
    ) -> Result<Vec<Applied>, StoreError> {
        self.apply_fenced(batch, None, worker_id, AckMode::Separate).await
    }

    /// The apply, fenced by `fence`'s lease token when given.
    async fn apply_fenced(
        &self,
        batch: &[(&Leased, OrderEvent)],
        fence: Option<&str>,
        worker_id: &str,
        ack: AckMode,
    ) -> Result<Vec<Applied>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let token = fence.unwrap_or_default();
        let deliveries: Vec<(&Leased, &OrderEvent)> = batch.iter().map(|(l, e)| (*l, e)).collect();
        if let Some(pg) = self.pg.as_ref().filter(|_| self.applies_in_one_statement()) {
            return self.apply_in_one_statement(pg, &deliveries, fence, worker_id, ack).await;
        }

        // BUG MODE inbox-outside-txn: the events are marked processed in a
        // transaction of their own, before the effect; if the effect then fails
        // (or the lease is found lost), the retry finds them "already processed".
        let marked_outside = if self.bug == Some(Bug::InboxOutsideTxn) {
            let mut conn = self.pool.acquire().await.map_err(NotCommitted)?;
            Some(self.insert_inbox(&mut conn, &deliveries).await?)
        } else {
            None
        };

        let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
        let held: HashSet<String> = if fence.is_some() {
            self.hold(&mut tx, token, &deliveries).await?
        } else {
            deliveries.iter().map(|(l, _)| l.message_id.clone()).collect()
        };
        let held_deliveries: Vec<(&Leased, &OrderEvent)> =
            deliveries.iter().copied().filter(|(l, _)| held.contains(l.message_id.as_str())).collect();

        // Which deliveries apply their event, and when (the database clock, in
        // the same transaction as the ledger rows).
        let (fresh, applies_every_copy) = match (self.bug, marked_outside) {
            // BUG MODE no-inbox: every delivery is applied, copies included.
            (Some(Bug::NoInbox), _) => {
                let now: i64 = sqlx::query_scalar(self.dialect.now).fetch_one(&mut *tx).await.map_err(NotCommitted)?;
                (held_deliveries.iter().map(|(_, e)| (e.event_id.clone(), now)).collect(), true)
            }
            (_, Some(marked)) => (marked, false),
            _ => (self.insert_inbox(&mut tx, &held_deliveries).await?, false),
        };
        let Sorted { outcomes, first_copies, mut duplicates } =
            sort_out(&deliveries, |id| held.contains(id), |id| fresh.get(id).copied(), applies_every_copy);
        self.count_duplicates(&mut tx, &mut duplicates).await?;

        // One write per item, with the sum of its new events.
        let mut per_item: BTreeMap<&str, i64> = BTreeMap::new();
        for (_, event) in &first_copies {
            *per_item.entry(event.item_id.as_str()).or_default() += event.qty;
        }
        let items: Vec<(&str, i64)> = per_item.into_iter().collect();
        if self.bug == Some(Bug::ReadModifyWriteProjection) {
            // BUG MODE read-modify-write-projection: read, add, write back. Two
            // workers on the same item both read the old value; one update is lost.
            for (item, qty) in &items {
                let current: Option<i64> = sqlx::query_scalar(sql::READ_PROJECTION_ROW)
                    .bind(*item)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(NotCommitted)?;
                sqlx::query(sql::SET_PROJECTION)
                    .bind(*item)
                    .bind(current.unwrap_or(0) + qty)
                    .execute(&mut *tx)
                    .await
                    .map_err(NotCommitted)?;
            }
        } else if !items.is_empty() {
            sqlx::query(self.dialect.add_to_projection)
                .bind(json_rows(&items))
                .execute(&mut *tx)
                .await
                .map_err(NotCommitted)?;
        }

        // The ledger: one row per application.
        if !first_copies.is_empty() {
            let rows: Vec<(&str, &str, &str, i64, i64)> = first_copies
                .iter()
                .map(|(l, e)| (e.event_id.as_str(), e.order_id.as_str(), e.item_id.as_str(), e.qty, l.delivery_count))
                .collect();
            sqlx::query(self.dialect.insert_ledger)
                .bind(json_rows(&rows))
                .bind(worker_id)
                .execute(&mut *tx)
                .await
                .map_err(NotCommitted)?;
        }
        if ack == AckMode::InApplyTxn {
            let ids: Vec<&str> = held_deliveries.iter().map(|(l, _)| l.message_id.as_str()).collect();
            self.delete_held(&mut tx, &ids, self.holder(Some(token))).await?;
        }
        if self.injected.roll() {
            let _ = tx.rollback().await;
            return Err(injected());
        }
        tx.commit().await.map_err(CommitUnknown)?;

        Ok(outcomes)
    }

    /// Whether a batch is applied by [`sql::APPLY_BATCH_POSTGRES`]: on
    /// PostgreSQL, unless a bug mode needs the steps apart (it skips the
    /// inbox or the fence, commits the inbox first, or reads the projection
    /// before writing it).
    fn applies_in_one_statement(&self) -> bool {
        self.pg.is_some()
            && !matches!(
                self.bug,
                Some(
                    Bug::NoInbox
                        | Bug::InboxOutsideTxn
                        | Bug::ReadModifyWriteProjection
                        | Bug::NoLeaseToken
                        | Bug::AckBeforeProcess
                )
            )
    }

    /// The apply of [`Store::apply_batch_with`] as one statement on
    /// PostgreSQL: it commits by itself, or writes nothing.
    async fn apply_in_one_statement(
        &self,
        pg: &PgPool,
        deliveries: &[(&Leased, &OrderEvent)],
        fence: Option<&str>,
        worker_id: &str,
        ack: AckMode,
    ) -> Result<Vec<Applied>, StoreError> {
        if self.injected.roll() {
            return Err(injected());
        }
        let statement = if fence.is_some() { sql::APPLY_BATCH_POSTGRES } else { sql::APPLY_DELIVERIES_POSTGRES };
        let n = deliveries.len();
        let (mut ids, mut events, mut attempts) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut orders, mut items, mut qtys) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for (leased, event) in deliveries {
            ids.push(leased.message_id.as_str());
            events.push(event.event_id.as_str());
            attempts.push(leased.delivery_count);
            orders.push(event.order_id.as_str());
            items.push(event.item_id.as_str());
            qtys.push(event.qty);
        }
        let rows: Vec<(String, String, Option<i64>)> = sqlx::query_as(statement)
            .bind(fence)
            .bind(&ids)
            .bind(&events)
            .bind(&attempts)
            .bind(&orders)
            .bind(&items)
            .bind(&qtys)
            .bind(worker_id)
            .bind(ack == AckMode::InApplyTxn)
            .fetch_all(pg)
            .await
            .map_err(|e| match fetched("inbox_processed")(e) {
                NotCommitted(e) => autocommitted(e),
                corrupt => corrupt,
            })?;
        // The exceptions: lost leases, old events (counted or not), and the time.
        let (mut lost, mut old, mut uncounted, mut now) = (HashSet::new(), HashSet::new(), HashSet::new(), None);
        for (kind, id, at) in rows {
            match (kind.as_str(), at) {
                ("l", _) => {
                    lost.insert(id);
                }
                ("d", _) => {
                    old.insert(id);
                }
                ("o", _) => {
                    old.insert(id.clone());
                    uncounted.insert(id);
                }
                ("t", Some(at)) => now = Some(at),
                _ => return Err(StoreError::Corrupt { table: "inbox_processed", why: format!("row {kind} {id}") }),
            }
        }
        let now = now.ok_or_else(|| StoreError::Corrupt { table: "inbox_processed", why: "no time row".into() })?;
        let Sorted { outcomes, mut duplicates, .. } =
            sort_out(deliveries, |id| !lost.contains(id), |id| (!old.contains(id)).then_some(now), false);
        // Copies of an event committed by another transaction after the
        // statement's snapshot: the statement could not count them. The
        // effect has committed, so a failure here loses a count of the
        // delivery evidence, not an application, and is only logged.
        duplicates.retain(|(_, e)| uncounted.contains(e.event_id.as_str()));
        if !duplicates.is_empty() {
            let counting = async {
                let mut conn = pg.acquire().await?;
                duplicates.sort_unstable_by(|a, b| a.1.event_id.cmp(&b.1.event_id));
                for (leased, event) in &duplicates {
                    sqlx::query(sql::COUNT_DUPLICATE)
                        .bind(event.event_id.as_str())
                        .bind(leased.delivery_count)
                        .execute(&mut *conn)
                        .await?;
                }
                Ok::<_, sqlx::Error>(())
            };
            if let Err(e) = counting.await {
                tracing::warn!(error = ?e, copies = duplicates.len(), "counting duplicates after the apply failed");
            }
        }
        Ok(outcomes)
    }

    /// The fence: locks and names the messages of `deliveries` that the lease
    /// `token` still holds.
    async fn hold(
        &self,
        tx: &mut sqlx::AnyConnection,
        token: &str,
        deliveries: &[(&Leased, &OrderEvent)],
    ) -> Result<HashSet<String>, StoreError> {
        let ids: Vec<&str> = deliveries.iter().map(|(l, _)| l.message_id.as_str()).collect();
        let rows = sqlx::query(self.dialect.hold)
            .bind(json_rows(&ids))
            .bind(token)
            .fetch_all(tx)
            .await
            .map_err(NotCommitted)?;
        rows.iter().map(|row| row.try_get::<String, _>(0).map_err(corrupt("queue_messages"))).collect()
    }

    /// Inserts the deliveries' events into the inbox, each with the delivery
    /// count it arrived with; returns the events that were new and when they
    /// were processed. In event order: two batches that share events (a
    /// redelivery racing its first delivery) wait on each other's inbox keys in
    /// one order, never in a cycle.
    async fn insert_inbox(
        &self,
        conn: &mut sqlx::AnyConnection,
        deliveries: &[(&Leased, &OrderEvent)],
    ) -> Result<HashMap<String, i64>, StoreError> {
        let mut rows: Vec<(&str, i64)> =
            deliveries.iter().map(|(l, e)| (e.event_id.as_str(), l.delivery_count)).collect();
        // Each event once, with the highest delivery count among its copies:
        // the inbox row records how many deliveries the queue had made when
        // the inbox saw the event (the other copies count as duplicates).
        rows.sort_unstable_by(|a, b| a.0.cmp(b.0).then(b.1.cmp(&a.1)));
        rows.dedup_by(|a, b| a.0 == b.0);
        if rows.is_empty() {
            return Ok(HashMap::new());
        }
        let inserted = sqlx::query(self.dialect.insert_inbox)
            .bind(json_rows(&rows))
            .fetch_all(conn)
            .await
            .map_err(NotCommitted)?;
        let c = corrupt("inbox_processed");
        inserted
            .iter()
            .map(|row| Ok((row.try_get::<String, _>(0).map_err(&c)?, row.try_get::<i64, _>(1).map_err(&c)?)))
            .collect()
    }

    /// Counts deliveries the inbox refused on their event's row, with the
    /// highest delivery count seen, in event order (as the inbox insert).
    /// Duplicates are the exception (a lost ack, a zombie), so one small
    /// statement each costs nothing on the common path.
    async fn count_duplicates(
        &self,
        conn: &mut sqlx::AnyConnection,
        duplicates: &mut [(&Leased, &OrderEvent)],
    ) -> Result<(), StoreError> {
        duplicates.sort_unstable_by(|a, b| a.1.event_id.cmp(&b.1.event_id));
        for (leased, event) in duplicates.iter() {
            sqlx::query(sql::COUNT_DUPLICATE)
                .bind(event.event_id.as_str())
                .bind(leased.delivery_count)
                .execute(&mut *conn)
                .await
                .map_err(NotCommitted)?;
        }
        Ok(())
    }

    /// Deletes the messages of one lease in one statement; returns how many
    /// were still held and so deleted.
    pub async fn ack_batch(&self, message_ids: &[&str], lease_token: &str) -> Result<u64, StoreError> {
        let holder = self.holder(Some(lease_token));
        if let Some(pg) = self.pg_settle.as_ref().or(self.pg.as_ref()) {
            let deleted = sqlx::query(sql::ACK_BATCH_POSTGRES).bind(holder).bind(message_ids).execute(pg).await;
            return Ok(deleted.map_err(NotCommitted)?.rows_affected());
        }
        let mut conn = self.pool.acquire().await.map_err(NotCommitted)?;
        self.delete_held(&mut conn, message_ids, holder).await
    }

    /// Deletes the messages `holder` (any holder when `None`) still holds.
    async fn delete_held(
        &self,
        conn: &mut sqlx::AnyConnection,
        message_ids: &[&str],
        holder: Option<&str>,
    ) -> Result<u64, StoreError> {
        if message_ids.is_empty() {
            return Ok(0);
        }
        let deleted =
            sqlx::query(self.dialect.delete_held).bind(json_rows(message_ids)).bind(holder).execute(conn).await;
        Ok(deleted.map_err(NotCommitted)?.rows_affected())
    }

    /// Deletes the message if the caller still holds its lease: an ack batch of
    /// one. False when the lease expired and someone else (or no one) holds it now.
    pub async fn ack(&self, message_id: &str, lease_token: &str) -> Result<bool, StoreError> {
        Ok(self.ack_batch(&[message_id], lease_token).await? == 1)
    }

    /// A delivery failed: retry after `backoff`, or dead-letter it once it has
    /// had `delivery_attempts_max` deliveries.
    pub async fn fail(
        &self,
        leased: &Leased,
        error: &str,
        backoff: Duration,
        delivery_attempts_max: u32,
    ) -> Result<Failed, StoreError> {
        if leased.delivery_count >= i64::from(delivery_attempts_max) {
            return self.dead_letter(&leased.message_id, Some(&leased.lease_token), error).await;
        }
        let updated = sqlx::query(self.dialect.retry_later)
            .bind(&leased.message_id)
            .bind(self.holder(Some(leased.lease_token.as_str())))
            .bind(backoff.as_millis() as i64)
            .bind(error)
            .execute(&self.pool)
            .await
            .map_err(NotCommitted)?
            .rows_affected();
        Ok(if updated == 1 { Failed::Retrying } else { Failed::LeaseLost })
    }

    /// Moves a message to the dead-letter table, if `lease_token` (when given)
    /// still holds it; or, when the inbox already holds its event, deletes it
    /// as acked (a message whose effect happened is not poison, and parking it
    /// would leave a dead letter for an applied event).
    pub async fn dead_letter(
        &self,
        message_id: &str,
        lease_token: Option<&str>,
        error: &str,
    ) -> Result<Failed, StoreError> {
        let lease_token = self.holder(lease_token);
        let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
        // Parked only if held and its event is not in the inbox.
        let parked = if self.bug == Some(Bug::DlqDrop) {
            // BUG MODE dlq-drop: the insert is skipped, so the message is simply deleted.
            true
        } else {
            sqlx::query(self.dialect.dead_letter)
                .bind(message_id)
                .bind(lease_token)
                .bind(error)
                .execute(&mut *tx)
                .await
                .map_err(NotCommitted)?
                .rows_affected()
                == 1
        };
        if !parked {
            // Settled, not parked: a delivery the inbox absorbed, counted as one.
            sqlx::query(sql::COUNT_SETTLED_DUPLICATE).bind(message_id).execute(&mut *tx).await.map_err(NotCommitted)?;
        }
        let deleted = sqlx::query(sql::DELETE_MESSAGE_HELD)
            .bind(message_id)
            .bind(lease_token)
            .execute(&mut *tx)
            .await
            .map_err(NotCommitted)?
            .rows_affected();
        if deleted == 0 {
            let _ = tx.rollback().await;
            return Ok(Failed::LeaseLost);
        }
        tx.commit().await.map_err(CommitUnknown)?;
        // Held but not parked: the inbox had its event.
        Ok(if parked { Failed::DeadLettered } else { Failed::Settled })
    }

    /// Parks a delivery a broker made (past its delivery limit, or failing
    /// on its last): a dead-letter row of its own, since the message is in
    /// the broker, not in `queue_messages`; or, when the inbox already holds
    /// its event (an ack was lost), nothing, and the caller acks it. A copy
    /// of a message already parked (the relay published it twice) parks
    /// nothing more.
    pub async fn dead_letter_delivery(&self, leased: &Leased, error: &str) -> Result<Failed, StoreError> {
        if self.bug == Some(Bug::DlqDrop) {
            // BUG MODE dlq-drop: the insert is skipped; the caller acks the message away.
            return Ok(Failed::DeadLettered);
        }
        let text = format!(
            "INSERT INTO dead_letters \
             (message_id, event_id, payload, headers, enqueued_at_ms, delivery_count, last_error, dead_at_ms) \
             SELECT $1, $2, $3, $4, $5, $6, $7, {} \
             WHERE NOT EXISTS (SELECT 1 FROM inbox_processed WHERE event_id = $2) \
             ON CONFLICT (message_id) DO NOTHING",
            self.dialect.clock
        );
        let headers = serde_json::to_string(&leased.headers).expect("headers serialize");
        sqlx::query(sqlx::AssertSqlSafe(text))
            .bind(leased.message_id.as_str())
            .bind(leased.event_id.as_str())
            .bind(leased.payload.as_str())
            .bind(headers)
            .bind(leased.enqueued_at_ms)
            .bind(leased.delivery_count)
            .bind(error)
            .execute(&self.pool)
            .await
            .map_err(autocommitted)?;
        let applied: Option<i64> =
            sqlx::query_scalar("SELECT CAST(1 AS BIGINT) FROM inbox_processed WHERE event_id = $1")
                .bind(leased.event_id.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(NotCommitted)?;
        Ok(if applied.is_some() { Failed::Settled } else { Failed::DeadLettered })
    }

    /// Moves dead letters back to the queue (all of them, or one), visible
    /// now, with a fresh delivery count and their last error. Returns how many
    /// moved. The rows inserted are exactly the rows deleted, whatever parks
    /// or redrives run beside it: a message is never in neither table, nor
    /// copied twice.
    pub async fn redrive(&self, message_id: Option<&str>) -> Result<u64, StoreError> {
        if self.backend == Backend::Postgres {
            // One statement, a data-modifying CTE: atomic on its own, and one
            // snapshot for the delete and the insert.
            let query = match message_id {
                None => sqlx::query(sql::REDRIVE_ALL_POSTGRES),
                Some(id) => sqlx::query(sql::REDRIVE_ONE_POSTGRES).bind(id),
            };
            let moved = query.execute(&self.pool).await.map_err(autocommitted)?.rows_affected();
            return Ok(moved);
        }
        // SQLite: DELETE … RETURNING, then an insert of exactly the rows it
        // returned, in one transaction. Correct whatever runs beside it: the
        // deleted rows are held by this transaction until it commits, so no one
        // else can move them, and what is inserted is what was deleted, not a
        // second read of the table. SQLite serializes writers besides: the
        // DELETE, a write first, takes the database's write lock, so nothing
        // is parked or redriven between the two statements.
        let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
        let rows = match message_id {
            None => sqlx::query(sql::DELETE_DEAD_ALL).fetch_all(&mut *tx).await,
            Some(id) => sqlx::query(sql::DELETE_DEAD_ONE).bind(id).fetch_all(&mut *tx).await,
        }
        .map_err(NotCommitted)?;
        let mut moved = 0;
        for chunk in rows.chunks(BATCH_ROWS_MAX) {
            let text = sql::redrive_insert_sqlite(chunk.len());
            let mut query = sqlx::query(sqlx::AssertSqlSafe(text));
            for row in chunk {
                let c = corrupt("dead_letters");
                query = query
                    .bind(row.try_get::<String, _>(0).map_err(&c)?)
                    .bind(row.try_get::<String, _>(1).map_err(&c)?)
                    .bind(row.try_get::<String, _>(2).map_err(&c)?)
                    .bind(row.try_get::<String, _>(3).map_err(&c)?)
                    .bind(row.try_get::<i64, _>(4).map_err(&c)?)
                    .bind(row.try_get::<Option<String>, _>(5).map_err(&c)?);
            }
            moved += query.execute(&mut *tx).await.map_err(NotCommitted)?.rows_affected();
        }
        tx.commit().await.map_err(CommitUnknown)?;
        Ok(moved)
    }

    /// Rebuilds the projection from the source of truth in one transaction: each
    /// item's `reserved_qty` becomes the sum over its orders whose event has been
    /// applied (events still queued will add themselves when applied), and orders
    /// whose event is nowhere at all are enqueued again.
    pub async fn reconcile(&self, dry_run: bool) -> Result<ReconcileReport, StoreError> {
        let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
        sqlx::query(self.dialect.reconcile_lock).execute(&mut *tx).await.map_err(NotCommitted)?;
        let expected: Vec<(String, i64)> =
            sqlx::query_as(sql::EXPECTED_PROJECTION).fetch_all(&mut *tx).await.map_err(NotCommitted)?;
        let current: Vec<(String, i64)> =
            sqlx::query_as(sql::PROJECTION).fetch_all(&mut *tx).await.map_err(NotCommitted)?;
        let mut items: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
        for (item, qty) in current {
            items.entry(item).or_default().0 = qty;
        }
        for (item, qty) in expected {
            items.entry(item).or_default().1 = qty;
        }
        let drift: Vec<Drift> = items
            .into_iter()
            .filter(|(_, (have, want))| have != want)
            .map(|(item_id, (reserved_qty, expected_qty))| Drift { item_id, reserved_qty, expected_qty })
            .collect();
        let orphans = sqlx::query(sql::ORPHAN_ORDERS).fetch_all(&mut *tx).await.map_err(NotCommitted)?;
        let mut report = ReconcileReport { drift, requeued: Vec::new(), dry_run };
        for row in &orphans {
            let order = stored_order(row)?;
            report.requeued.push(order.order_id.clone());
            if !dry_run {
                let new = NewOrder {
                    order_id: order.order_id.clone(),
                    item_id: order.item_id.clone(),
                    qty: order.qty,
                    correlation_id: order.correlation_id.clone(),
                    traceparent: None,
                };
                self.enqueue(&mut tx, &new, &event_for(&new, &order.event_id)).await?;
            }
        }
        if dry_run {
            let _ = tx.rollback().await;
            return Ok(report);
        }
        for d in &report.drift {
            sqlx::query(sql::SET_PROJECTION)
                .bind(&d.item_id)
                .bind(d.expected_qty)
                .execute(&mut *tx)
                .await
                .map_err(NotCommitted)?;
        }
        tx.commit().await.map_err(CommitUnknown)?;
        Ok(report)
    }

    /// Forgets that the first `limit` applied events (by event id) were ever
    /// applied: their inbox entries and ledger lines go, their projection stays.
    /// A lost effect and the drift beside it, as after a restore from an old
    /// backup: what reconcile exists to repair. Returns their event ids. For
    /// tests.
    pub async fn forget_applications(&self, limit: i64) -> Result<Vec<String>, StoreError> {
        let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
        let ids: Vec<String> =
            sqlx::query_scalar(sql::FIRST_APPLIED).bind(limit).fetch_all(&mut *tx).await.map_err(NotCommitted)?;
        for id in &ids {
            for statement in [sql::FORGET_INBOX_ENTRY, sql::FORGET_LEDGER_LINES] {
                sqlx::query(statement).bind(id).execute(&mut *tx).await.map_err(NotCommitted)?;
            }
        }
        tx.commit().await.map_err(CommitUnknown)?;
        Ok(ids)
    }

    /// Adds `delta` to an item's projection behind the pipeline's back: the drift
    /// that reconcile exists to repair. For tests and the tutorial.
    pub async fn corrupt_projection(&self, item_id: &str, delta: i64) -> Result<(), StoreError> {
        sqlx::query(sql::UPSERT_PROJECTION)
            .bind(item_id)
            .bind(delta)
            .execute(&self.pool)
            .await
            .map_err(NotCommitted)?;
        Ok(())
    }

    /// Whether the pipeline's tables hold no rows at all.
    pub async fn is_empty(&self) -> Result<bool, StoreError> {
        let rows: i64 = sqlx::query_scalar(sql::ROWS_IN_PIPELINE).fetch_one(&self.pool).await.map_err(NotCommitted)?;
        Ok(rows == 0)
    }

    /// Whether the queue holds no message at all (visible, leased or waiting
    /// out a backoff; dead letters are elsewhere). Stops at the first row it
    /// finds, so a watcher that polls it costs the database far less than
    /// [`Store::queue_stats`], which counts every row.
    pub async fn queue_is_empty(&self) -> Result<bool, StoreError> {
        let any: i64 = sqlx::query_scalar(sql::QUEUE_HAS_ROWS).fetch_one(&self.pool).await.map_err(NotCommitted)?;
        Ok(any == 0)
    }

    pub async fn projection(&self) -> Result<Vec<(String, i64)>, StoreError> {
        sqlx::query_as(sql::PROJECTION).fetch_all(&self.pool).await.map_err(NotCommitted)
    }

    pub async fn queue_stats(&self) -> Result<QueueStats, StoreError> {
        let (visible, leased, delayed, oldest_age_ms): (i64, i64, i64, i64) =
            sqlx::query_as(self.dialect.queue_stats).fetch_one(&self.pool).await.map_err(NotCommitted)?;
        let dead_letter: i64 =
            sqlx::query_scalar(self.dialect.dead_letter_count).fetch_one(&self.pool).await.map_err(NotCommitted)?;
        Ok(QueueStats { visible, leased, delayed, dead_letter, oldest_age_ms })
    }

    /// The final state (all but `meta`) collected in memory: for tests and
    /// small stores; runs stream it with [`Store::final_state`].
    pub async fn final_state_lines(&self) -> Result<Vec<FinalLine>, StoreError> {
        let mut lines = Vec::new();
        self.final_state(|line| {
            lines.push(line);
            Ok(())
        })
        .await?;
        Ok(lines)
    }

    /// Streams the final state (every line of `final-state.jsonl` but `meta`,
    /// which only the harness can write) from one consistent snapshot.
    pub async fn final_state(&self, mut sink: impl FnMut(FinalLine) -> std::io::Result<()>) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
        if self.backend == Backend::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                .execute(&mut *tx)
                .await
                .map_err(NotCommitted)?;
        }
        let mut emit = |line| sink(line).map_err(StoreError::Sink);
        {
            let mut rows = sqlx::query(sql::FINAL_ORDERS).fetch(&mut *tx);
            while let Some(row) = rows.try_next().await.map_err(NotCommitted)? {
                let c = corrupt("orders");
                let deliveries: Option<i64> = row.try_get(4).map_err(&c)?;
                let duplicates: Option<i64> = row.try_get(5).map_err(&c)?;
                emit(FinalLine::Order(haunt_format::OrderRow {
                    order_id: row.try_get(0).map_err(&c)?,
                    item_id: row.try_get(1).map_err(&c)?,
                    qty: row.try_get(2).map_err(&c)?,
                    event_id: row.try_get(3).map_err(&c)?,
                    deliveries: deliveries.map(count),
                    // An event the inbox never saw had nothing absorbed.
                    duplicates_absorbed: deliveries.map(|_| count(duplicates.unwrap_or(0))),
                }))?;
            }
        }
        {
            let mut rows = sqlx::query(sql::FINAL_LEDGER).fetch(&mut *tx);
            while let Some(row) = rows.try_next().await.map_err(NotCommitted)? {
                let c = corrupt("projection_ledger");
                emit(FinalLine::Applied(haunt_format::Applied {
                    event_id: row.try_get(0).map_err(&c)?,
                    order_id: row.try_get(1).map_err(&c)?,
                    item_id: row.try_get(2).map_err(&c)?,
                    qty: row.try_get(3).map_err(&c)?,
                    delivery_attempt: count(row.try_get(4).map_err(&c)?),
                    worker_id: row.try_get(5).map_err(&c)?,
                    applied_at_ms: row.try_get(6).map_err(&c)?,
                }))?;
            }
        }
        {
            let mut rows = sqlx::query(sql::PROJECTION).fetch(&mut *tx);
            while let Some(row) = rows.try_next().await.map_err(NotCommitted)? {
                let c = corrupt("inventory_projection");
                emit(FinalLine::Projection(haunt_format::ProjectionRow {
                    item_id: row.try_get(0).map_err(&c)?,
                    reserved_qty: row.try_get(1).map_err(&c)?,
                }))?;
            }
        }
        {
            let mut rows = sqlx::query(sql::FINAL_PENDING).fetch(&mut *tx);
            while let Some(row) = rows.try_next().await.map_err(NotCommitted)? {
                let c = corrupt("queue_messages");
                emit(FinalLine::Pending(haunt_format::Pending {
                    message_id: row.try_get(0).map_err(&c)?,
                    event_id: row.try_get(1).map_err(&c)?,
                    delivery_count: count(row.try_get(2).map_err(&c)?),
                }))?;
            }
        }
        {
            let mut rows = sqlx::query(sql::FINAL_DEAD).fetch(&mut *tx);
            while let Some(row) = rows.try_next().await.map_err(NotCommitted)? {
                let c = corrupt("dead_letters");
                emit(FinalLine::DeadLetter(haunt_format::DeadLetter {
                    message_id: row.try_get(0).map_err(&c)?,
                    event_id: row.try_get(1).map_err(&c)?,
                    delivery_count: count(row.try_get(2).map_err(&c)?),
                    last_error: row.try_get(3).map_err(&c)?,
                }))?;
            }
        }
        let _ = tx.rollback().await;
        Ok(())
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
