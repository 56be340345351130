//! [`Baseline`]: the baselines of `haunt bench pipeline`.
//!
//! These are benchmark baselines, not part of the pipeline: SQL that speaks the
//! pipeline's tables directly, so the bench can set what the database can do
//! beside what haunt's worker and API do. They live in the store, not in the
//! bench, so that the architecture invariant holds: only this crate reads or
//! writes those tables, and a change of schema is made, and seen, in one
//! place. Nothing of the service uses them.
//!
//! - The **server-side limit** ([`Baseline::server_side_drain`]): haunt's own
//!   protocol (lease, commit; apply through the inbox, commit; ack, commit)
//!   run entirely inside the database, so that no client, driver or round trip
//!   costs anything. On PostgreSQL it is one `CALL` of a PL/pgSQL procedure
//!   per batch (`baseline/server_side_postgres.sql`, created by
//!   [`Baseline::install_server_side`] and dropped by
//!   [`Baseline::drop_server_side`]); on SQLite, where there is no server, a
//!   loop of prepared statements on one native connection whose batch never
//!   leaves the database (it is kept in temporary tables). This is the limit
//!   the worker is measured against.
//! - The **client-side SQL baseline** ([`Baseline::client_sql_drain`],
//!   PostgreSQL only): the same protocol as three hand-written statements
//!   sent by the client, the JSON parsed in SQL. Until 2026-12-01 the bench
//!   called it "the raw ceiling"; it is not one (the worker beats it).
//! - The **locked variant** ([`Baseline::client_sql_locked_drain`]): no lease,
//!   rows locked from read to delete in one transaction. A different queue
//!   design, shown for reference.
//! - The **raw insert** ([`Baseline::raw_ingest`]): the API's commit as a
//!   client would write it.
//! - **A consumer over pgmq** ([`Baseline::pgmq_drain`], PostgreSQL only),
//!   written as pgmq's documentation shows a client: `pgmq.read` a batch, one
//!   transaction for the effect, then `pgmq.delete` the batch. pgmq's SQL is
//!   not haunt's: [`Baseline::pgmq_install`] runs the file a user points the
//!   bench at (pgmq's SQL-only install, `pgmq-extension/sql/pgmq.sql`).
//!
//! A [`Baseline`] has a pool of its own (no pragmas, no acquire timeout beyond
//! sqlx's), as the bench always had, so the figures it reports stay comparable
//! with the ones measured before the baselines moved here.

use std::str::FromStr;

use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous};
use sqlx::{AnyPool, ConnectOptions, Connection};

use crate::StoreError;
use crate::StoreError::{CommitUnknown, NotCommitted};
use crate::sql;
use crate::{DbKind, DbUrl};

/// Rows per multi-row insert while pre-enqueuing: 6 binds a row, far below
/// both backends' limits on bound parameters, and large enough that the setup
/// costs a few seconds at most.
const ENQUEUE_CHUNK: usize = 500;

/// The pipeline's tables, emptied between the bench's phases.
const TABLES: [&str; 6] =
    ["orders", "queue_messages", "inbox_processed", "inventory_projection", "projection_ledger", "dead_letters"];

/// The baselines over a pool of their own.
#[derive(Debug, Clone)]
pub struct Baseline {
    pool: AnyPool,
    db: DbUrl,
}

/// The queue held from every lease ([`Baseline::hold_queue`]); dropped
/// without [`QueueHold::release`], its transaction rolls back and lets go too.
#[derive(Debug)]
pub struct QueueHold {
    tx: sqlx::Transaction<'static, sqlx::Any>,
}

impl QueueHold {
    /// Lets the waiting leases through.
    pub async fn release(self) -> Result<(), StoreError> {
        self.tx.rollback().await.map_err(NotCommitted)
    }
}

/// What a drain left: the bench checks every event was applied once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainCounts {
    /// Messages still in the queue.
    pub queued: i64,
    /// Distinct events in the ledger.
    pub applied_events: i64,
    /// Ledger rows (one per application).
    pub ledger_rows: i64,
    /// The sum of the projection.
    pub projection_total: i64,
    /// Ledger rows numbered as the worker numbers them (issue 33's order
    /// record): each a distinct `key_seq` of its item, from 1 to the count of
    /// applications its projection row keeps. Equal to `ledger_rows` after a
    /// drain that kept the record; 0 after one that did not.
    pub numbered: i64,
}

/// The clock of the process, in ms since the epoch: the baselines stamp rows as
/// a client would, not with the database clock.
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Baseline {
    /// A pool of `max_connections` on `db`. The store must have been opened
    /// (and so migrated) on it first.
    pub async fn connect(db: &DbUrl, max_connections: u32) -> Result<Baseline, StoreError> {
        sqlx::any::install_default_drivers();
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(max_connections)
            .connect(db.as_str())
            .await
            .map_err(StoreError::Connect)?;
        Ok(Baseline { pool, db: db.clone() })
    }

    /// Opens `n` connections now, so that a phase timed over this pool does
    /// not time its connects.
    pub async fn warm(&self, n: u32) -> Result<(), StoreError> {
        crate::store::open_held(&self.pool, n).await
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Empties the pipeline's tables. On PostgreSQL by TRUNCATE, so that no
    /// phase pays for the dead rows of the one before it.
    pub async fn reset(&self) -> Result<(), StoreError> {
        if self.db.kind() == DbKind::Postgres {
            let text = format!("TRUNCATE {}", TABLES.join(", "));
            sqlx::query(sqlx::AssertSqlSafe(text)).execute(&self.pool).await.map_err(NotCommitted)?;
            return Ok(());
        }
        for table in TABLES {
            sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table}")))
                .execute(&self.pool)
                .await
                .map_err(NotCommitted)?;
        }
        Ok(())
    }

    /// Brings the tables to the same state before every drain phase, so that
    /// no phase pays for another's housekeeping: on PostgreSQL the freshly
    /// enqueued tables vacuumed and analyzed, autovacuum off for them (it
    /// otherwise woke at random in the middle of a drain, on the dead rows
    /// of the deletes) and a checkpoint, so that every phase starts as far
    /// from the next one (and its full-page writes) as any other; on SQLite
    /// a checkpoint of the WAL. Autovacuum stays off for these tables until
    /// [`Baseline::housekeeping_back_on`]. Returns whether the checkpoint
    /// ran: `CHECKPOINT` needs a superuser or the `pg_checkpoint` role, and
    /// without either the phases still run, less evenly.
    pub async fn settle(&self) -> Result<bool, StoreError> {
        if self.db.kind() == DbKind::Sqlite {
            sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE)").execute(&self.pool).await.map_err(NotCommitted)?;
            return Ok(true);
        }
        for table in TABLES {
            let off = format!("ALTER TABLE {table} SET (autovacuum_enabled = off)");
            sqlx::raw_sql(sqlx::AssertSqlSafe(off)).execute(&self.pool).await.map_err(NotCommitted)?;
        }
        let vacuum = format!("VACUUM (ANALYZE) {}", TABLES.join(", "));
        sqlx::raw_sql(sqlx::AssertSqlSafe(vacuum)).execute(&self.pool).await.map_err(NotCommitted)?;
        Ok(sqlx::raw_sql("CHECKPOINT").execute(&self.pool).await.is_ok())
    }

    /// Autovacuum back on for the pipeline's tables, after [`Baseline::settle`].
    pub async fn housekeeping_back_on(&self) -> Result<(), StoreError> {
        if self.db.kind() == DbKind::Postgres {
            for table in TABLES {
                let on = format!("ALTER TABLE {table} RESET (autovacuum_enabled)");
                sqlx::raw_sql(sqlx::AssertSqlSafe(on)).execute(&self.pool).await.map_err(NotCommitted)?;
            }
        }
        Ok(())
    }

    /// Writes `n` orders (`b-I`, over `items` items, one each) and their
    /// messages, visible at once, as the API would have.
    pub async fn enqueue(&self, n: usize, items: usize) -> Result<(), StoreError> {
        self.enqueue_from(0, n, items).await
    }

    /// [`Baseline::enqueue`] with the orders, events and messages numbered
    /// from `first`: a broker that deduplicates by message id (JetStream's
    /// `Nats-Msg-Id`, an SQS FIFO queue) would drop a second phase's
    /// messages under the first one's ids.
    pub async fn enqueue_from(&self, first: usize, n: usize, items: usize) -> Result<(), StoreError> {
        // A second in the past: visible whatever the small skew between clocks.
        let at = now_ms() - 1_000;
        for start in (first..first + n).step_by(ENQUEUE_CHUNK) {
            let rows = ENQUEUE_CHUNK.min(first + n - start);
            let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
            let orders = format!(
                "INSERT INTO orders (order_id, item_id, qty, event_id, correlation_id, created_at_ms) VALUES {}",
                sql::values(1, rows, 6, "")
            );
            let messages = format!(
                "INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, visible_at_ms) \
                 VALUES {}",
                sql::values(1, rows, 6, "")
            );
            let mut o = sqlx::query(sqlx::AssertSqlSafe(orders));
            let mut m = sqlx::query(sqlx::AssertSqlSafe(messages));
            for i in start..start + rows {
                let (order_id, event_id, item_id) = (format!("b-{i}"), format!("e-{i}"), format!("item-{}", i % items));
                let payload = json!({"event_id": event_id, "order_id": order_id, "item_id": item_id, "qty": 1});
                let headers = headers_of(&order_id, i);
                o = o.bind(order_id.clone()).bind(item_id).bind(1i64).bind(event_id.clone()).bind(order_id).bind(at);
                m = m.bind(format!("m-{i}")).bind(event_id).bind(payload.to_string()).bind(headers).bind(at).bind(at);
            }
            o.execute(&mut *tx).await.map_err(NotCommitted)?;
            m.execute(&mut *tx).await.map_err(NotCommitted)?;
            tx.commit().await.map_err(CommitUnknown)?;
        }
        Ok(())
    }

    async fn count(&self, text: &'static str) -> Result<i64, StoreError> {
        sqlx::query_scalar::<_, i64>(text).fetch_one(&self.pool).await.map_err(NotCommitted)
    }

    /// Where the server's WAL ends, in bytes from its start (PostgreSQL): the
    /// difference of two readings is the WAL every session wrote between
    /// them. `None` where the server cannot say (a standby, or SQLite).
    pub async fn wal_position(&self) -> Option<i64> {
        if self.db.kind() != DbKind::Postgres {
            return None;
        }
        sqlx::query_scalar::<_, i64>(WAL_POSITION).fetch_one(&self.pool).await.ok()
    }

    /// The queue, the ledger and the projection after a drain.
    pub async fn drain_counts(&self) -> Result<DrainCounts, StoreError> {
        Ok(DrainCounts {
            queued: self.count("SELECT CAST(COUNT(*) AS BIGINT) FROM queue_messages").await?,
            applied_events: self
                .count("SELECT CAST(COUNT(DISTINCT event_id) AS BIGINT) FROM projection_ledger")
                .await?,
            ledger_rows: self.count("SELECT CAST(COUNT(*) AS BIGINT) FROM projection_ledger").await?,
            projection_total: self
                .count("SELECT CAST(COALESCE(SUM(reserved_qty), 0) AS BIGINT) FROM inventory_projection")
                .await?,
            numbered: self.count(NUMBERED_LEDGER_ROWS).await?,
        })
    }

    /// Whether the client-side SQL baselines ([`Baseline::client_sql_drain`],
    /// [`Baseline::client_sql_locked_drain`]) can run here: they read the JSON
    /// payload in SQL and lock with `SKIP LOCKED`, which is PostgreSQL's only.
    pub fn has_client_sql_baseline(&self) -> bool {
        self.db.kind() == DbKind::Postgres
    }

    fn assert_postgres(&self) {
        // The bench asks has_client_sql_baseline first; calling on SQLite is its bug.
        assert!(self.has_client_sql_baseline(), "the client-side SQL baseline is PostgreSQL's only");
    }

    /// Creates what the server-side limit runs (on PostgreSQL its procedure,
    /// replaced if a bench that died left one); nothing on SQLite.
    pub async fn install_server_side(&self) -> Result<(), StoreError> {
        if self.db.kind() == DbKind::Postgres {
            sqlx::raw_sql(SERVER_SIDE_POSTGRES).execute(&self.pool).await.map_err(NotCommitted)?;
        }
        Ok(())
    }

    /// Drops what [`Baseline::install_server_side`] created.
    pub async fn drop_server_side(&self) -> Result<(), StoreError> {
        if self.db.kind() == DbKind::Postgres {
            sqlx::raw_sql(DROP_SERVER_SIDE_POSTGRES).execute(&self.pool).await.map_err(NotCommitted)?;
        }
        Ok(())
    }

    /// The server-side limit: haunt's protocol, `batch_size` at a time, run
    /// inside the database until the queue is empty. Returns the batches it
    /// took. `task` names this consumer in the ledger.
    ///
    /// Three commits per batch, as haunt's worker does: the lease, the apply
    /// (inbox, projection, ledger), the ack. With `ack_in_effect` two: the ack
    /// joins the apply's transaction. With `async_lease_ack` (PostgreSQL only)
    /// the lease's and the ack's commits do not wait for the WAL flush
    /// (`synchronous_commit = off`); the apply's does. On PostgreSQL, one `CALL` per batch over this baseline's
    /// pool; on SQLite, a prepared-statement loop on a native connection of its
    /// own (no pool, no `Any` rows), with the store's pragmas.
    pub async fn server_side_drain(
        &self,
        task: usize,
        batch_size: i64,
        ack_in_effect: bool,
        async_lease_ack: bool,
    ) -> Result<u64, StoreError> {
        let worker = format!("server-side-{task}");
        if self.db.kind() == DbKind::Sqlite {
            // The bench asks for it on PostgreSQL only; on SQLite it is its bug.
            assert!(!async_lease_ack, "synchronous_commit is PostgreSQL's");
            return self.server_side_drain_sqlite(&worker, batch_size, ack_in_effect).await;
        }
        let mut conn = self.pool.acquire().await.map_err(NotCommitted)?;
        // Bounded by the queue: every call acks the batch it leased, and an
        // empty lease ends the drain.
        for batches in 0.. {
            let leased: i64 = sqlx::query_scalar(SERVER_SIDE_CALL)
                .bind(batch_size)
                .bind(&worker)
                .bind(ack_in_effect)
                .bind(async_lease_ack)
                .fetch_one(&mut *conn)
                .await
                .map_err(NotCommitted)?;
            if leased == 0 {
                return Ok(batches);
            }
        }
        unreachable!("a drain ends when a lease comes back empty")
    }

    async fn server_side_drain_sqlite(
        &self,
        worker: &str,
        batch_size: i64,
        ack_in_effect: bool,
    ) -> Result<u64, StoreError> {
        // The store's pragmas (WAL, NORMAL sync, the busy timeout), so that the
        // limit commits as durably as haunt's workers do.
        let options = SqliteConnectOptions::from_str(self.db.as_str())
            .map_err(StoreError::Connect)?
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(std::time::Duration::from_secs(5))
            .pragma("temp_store", "MEMORY");
        let mut conn: SqliteConnection = options.connect().await.map_err(StoreError::Connect)?;
        for text in SQLITE_TEMP_TABLES {
            sqlx::query(text).execute(&mut conn).await.map_err(NotCommitted)?;
        }
        // Bounded by the queue, as on PostgreSQL.
        for batches in 0.. {
            let token = uuid::Uuid::new_v4().to_string();
            // 1. Lease: named in a temporary table, so the batch stays in the database.
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(NotCommitted)?;
            sqlx::query(SQLITE_CLEAR_LEASED).execute(&mut *tx).await.map_err(NotCommitted)?;
            sqlx::query(SQLITE_PICK).bind(batch_size).execute(&mut *tx).await.map_err(NotCommitted)?;
            let leased = sqlx::query(SQLITE_LEASE)
                .bind(&token)
                .bind(VISIBILITY_MS)
                .execute(&mut *tx)
                .await
                .map_err(NotCommitted)?
                .rows_affected();
            tx.commit().await.map_err(CommitUnknown)?;
            if leased == 0 {
                return Ok(batches);
            }
            // 2. Apply, fenced: BEGIN IMMEDIATE holds the write lock, so the rows
            // the token still names stay its own until the commit.
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(NotCommitted)?;
            sqlx::query(SQLITE_CLEAR_BATCH).execute(&mut *tx).await.map_err(NotCommitted)?;
            sqlx::query(SQLITE_HOLD).bind(&token).execute(&mut *tx).await.map_err(NotCommitted)?;
            sqlx::query(SQLITE_INBOX).execute(&mut *tx).await.map_err(NotCommitted)?;
            sqlx::query(SQLITE_DUPLICATES).execute(&mut *tx).await.map_err(NotCommitted)?;
            // The ledger first: it numbers each item's new events from the
            // count the projection row holds before this batch adds to it.
            sqlx::query(SQLITE_LEDGER).bind(worker).execute(&mut *tx).await.map_err(NotCommitted)?;
            sqlx::query(SQLITE_PROJECTION).execute(&mut *tx).await.map_err(NotCommitted)?;
            if ack_in_effect {
                sqlx::query(SQLITE_ACK).bind(&token).execute(&mut *tx).await.map_err(NotCommitted)?;
            }
            tx.commit().await.map_err(CommitUnknown)?;
            // 3. Ack: one statement, its own commit.
            if !ack_in_effect {
                sqlx::query(SQLITE_ACK).bind(&token).execute(&mut conn).await.map_err(NotCommitted)?;
            }
        }
        unreachable!("a drain ends when a lease comes back empty")
    }

    /// The process ids of the server backends connected to this database
    /// under `application_name`, so that the bench can read what a worker's
    /// connections cost the server in CPU. Empty on SQLite, which has no server.
    pub async fn backend_pids(&self, application_name: &str) -> Result<Vec<i64>, StoreError> {
        if self.db.kind() != DbKind::Postgres {
            return Ok(Vec::new());
        }
        sqlx::query_scalar(BACKENDS_NAMED).bind(application_name).fetch_all(&self.pool).await.map_err(NotCommitted)
    }

    /// Holds every lease off the queue until [`QueueHold::release`]: a
    /// transaction of the bench's holding the queue's table in `EXCLUSIVE`
    /// mode, which lets plain reads through (the bench's probes) but makes each lease
    /// wait for it. So worker processes can start, connect and send their
    /// first lease before a drain's clock starts, as the in-process workers
    /// do. `None` on SQLite, whose only lock that would hold them also fails
    /// their start.
    pub async fn hold_queue(&self) -> Result<Option<QueueHold>, StoreError> {
        if self.db.kind() != DbKind::Postgres {
            return Ok(None);
        }
        let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
        sqlx::raw_sql(HOLD_QUEUE).execute(&mut *tx).await.map_err(NotCommitted)?;
        Ok(Some(QueueHold { tx }))
    }

    /// How many ledger rows have been numbered so far: the position of the
    /// sequence that numbers them (0 before the first). The ledger has one
    /// row per applied event, so a watcher sees a drain's progress in one
    /// read of a counter, with no plan to choose (the tables' statistics are
    /// those of their empty state before a drain), instead of probing the
    /// queue, whose head the acks fill with dead rows. A row is numbered when
    /// inserted, before its transaction commits, so the difference of two
    /// reads says "about done", and the queue says when.
    pub async fn ledger_numbered(&self) -> Result<i64, StoreError> {
        let sql = match self.db.kind() {
            DbKind::Postgres => LEDGER_NUMBERED_POSTGRES,
            DbKind::Sqlite => LEDGER_NUMBERED_SQLITE,
        };
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.map_err(NotCommitted)
    }

    /// How many backends connected under `application_name` wait for a lock,
    /// such as the leases a [`QueueHold`] holds off. 0 on SQLite.
    pub async fn lock_waiters(&self, application_name: &str) -> Result<usize, StoreError> {
        if self.db.kind() != DbKind::Postgres {
            return Ok(0);
        }
        let n: i64 = sqlx::query_scalar(LOCK_WAITERS)
            .bind(application_name)
            .fetch_one(&self.pool)
            .await
            .map_err(NotCommitted)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The client-side SQL baseline (the bench's "raw ceiling" until
    /// 2026-12-01): the pipeline's protocol in hand-written SQL sent by the
    /// client, `batch_size` at a time, until the queue is empty: lease (a
    /// committed lease token and visibility timeout, so that a crash hands the
    /// batch on), apply (one statement, the JSON parsed in SQL, fenced by the
    /// token), delete. `task` makes the tokens unique. PostgreSQL only.
    pub async fn client_sql_drain(&self, task: usize, batch_size: i64) -> Result<(), StoreError> {
        self.assert_postgres();
        // Bounded by the queue: every round deletes the batch it leased, and an
        // empty lease ends the drain.
        for batch in 0.. {
            let token = format!("client-sql-{task}-{batch}");
            let ids: Vec<String> = sqlx::query_scalar(CLIENT_SQL_LEASE)
                .bind(batch_size)
                .bind(&token)
                .fetch_all(&self.pool)
                .await
                .map_err(NotCommitted)?;
            if ids.is_empty() {
                break;
            }
            let list = ids.join(",");
            sqlx::query(CLIENT_SQL_APPLY_LEASED)
                .bind(&token)
                .bind(&list)
                .execute(&self.pool)
                .await
                .map_err(NotCommitted)?;
            sqlx::query(CLIENT_SQL_ACK).bind(&token).bind(&list).execute(&self.pool).await.map_err(NotCommitted)?;
        }
        Ok(())
    }

    /// A different queue design, shown for reference: no lease at all, the
    /// batch's rows locked (`FOR UPDATE SKIP LOCKED`) from the read to the
    /// delete in one transaction, in hand-written SQL sent by the client. One
    /// commit per batch instead of three, but a consumer that holds row locks
    /// while it works, which is not the visibility-timeout protocol haunt
    /// tests. PostgreSQL only.
    pub async fn client_sql_locked_drain(&self, batch_size: i64) -> Result<(), StoreError> {
        self.assert_postgres();
        // Bounded by the queue, as client_sql_drain is.
        loop {
            let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
            let ids: Vec<String> =
                sqlx::query_scalar(CLIENT_SQL_LOCK).bind(batch_size).fetch_all(&mut *tx).await.map_err(NotCommitted)?;
            if ids.is_empty() {
                tx.commit().await.map_err(CommitUnknown)?;
                return Ok(());
            }
            let list = ids.join(",");
            sqlx::query(CLIENT_SQL_APPLY).bind(&list).execute(&mut *tx).await.map_err(NotCommitted)?;
            sqlx::query(CLIENT_SQL_DELETE).bind(&list).execute(&mut *tx).await.map_err(NotCommitted)?;
            tx.commit().await.map_err(CommitUnknown)?;
        }
    }

    /// The raw insert transaction the API's commit amounts to, for orders
    /// `r-I` with I from `client` to `n` in steps of `clients`.
    pub async fn raw_ingest(&self, client: usize, clients: usize, n: usize) -> Result<(), StoreError> {
        for i in (client..n).step_by(clients) {
            let (order_id, event_id) = (format!("r-{i}"), format!("re-{i}"));
            let payload =
                json!({"event_id": event_id, "order_id": order_id, "item_id": "item-0", "qty": 1}).to_string();
            let headers = headers_of(&order_id, i);
            let at = now_ms();
            let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
            sqlx::query(RAW_INSERT_ORDER)
                .bind(&order_id)
                .bind(&event_id)
                .bind(at)
                .execute(&mut *tx)
                .await
                .map_err(NotCommitted)?;
            sqlx::query(RAW_INSERT_MESSAGE)
                .bind(format!("rm-{i}"))
                .bind(&event_id)
                .bind(payload)
                .bind(headers)
                .bind(at)
                .execute(&mut *tx)
                .await
                .map_err(NotCommitted)?;
            tx.commit().await.map_err(CommitUnknown)?;
        }
        Ok(())
    }
}

/// The pgmq queue the bench creates, fills and drains.
pub const PGMQ_QUEUE: &str = "haunt_bench";

impl Baseline {
    /// Installs pgmq from `sql` (the text of its SQL-only install, which
    /// creates the schema `pgmq`). Refused where a schema `pgmq` exists: the
    /// bench drops what it installed ([`Baseline::pgmq_uninstall`]) and must
    /// not drop a user's. PostgreSQL only.
    pub async fn pgmq_install(&self, sql: &str) -> Result<(), StoreError> {
        self.assert_postgres();
        let exists: i64 = sqlx::query_scalar(PGMQ_SCHEMA_EXISTS).fetch_one(&self.pool).await.map_err(NotCommitted)?;
        if exists > 0 {
            return Err(StoreError::Refused(
                "the database already has a schema pgmq; the bench installs its own and drops it after".into(),
            ));
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(&self.pool).await.map_err(NotCommitted)?;
        // What the file was: it must have made pgmq's functions.
        let functions: i64 = sqlx::query_scalar(PGMQ_FUNCTIONS).fetch_one(&self.pool).await.map_err(NotCommitted)?;
        if functions < 4 {
            let _ = self.pgmq_uninstall().await;
            return Err(StoreError::Refused(format!(
                "the pgmq SQL made {functions} of pgmq.create, pgmq.send_batch, pgmq.read and pgmq.delete: \
                 is it pgmq's pgmq-extension/sql/pgmq.sql?"
            )));
        }
        Ok(())
    }

    /// Drops the schema `pgmq`, with every queue in it.
    pub async fn pgmq_uninstall(&self) -> Result<(), StoreError> {
        sqlx::raw_sql("DROP SCHEMA IF EXISTS pgmq CASCADE").execute(&self.pool).await.map_err(NotCommitted)?;
        Ok(())
    }

    /// Creates the bench's queue ([`PGMQ_QUEUE`]) and sends it `n` messages
    /// (`p-I`, over `items` items, one each) by `pgmq.send_batch`; then
    /// vacuums, analyzes and checkpoints, as [`Baseline::settle`] does for
    /// haunt's queue. Returns whether the checkpoint ran.
    pub async fn pgmq_enqueue(&self, n: usize, items: usize) -> Result<bool, StoreError> {
        self.assert_postgres();
        sqlx::query(PGMQ_CREATE).bind(PGMQ_QUEUE).execute(&self.pool).await.map_err(NotCommitted)?;
        for start in (0..n).step_by(ENQUEUE_CHUNK) {
            let rows = ENQUEUE_CHUNK.min(n - start);
            let batch: Vec<serde_json::Value> = (start..start + rows)
                .map(|i| json!({"event_id": format!("pe-{i}"), "order_id": format!("p-{i}"), "item_id": format!("item-{}", i % items), "qty": 1}))
                .collect();
            sqlx::query(PGMQ_SEND_BATCH)
                .bind(PGMQ_QUEUE)
                .bind(serde_json::Value::Array(batch).to_string())
                .execute(&self.pool)
                .await
                .map_err(NotCommitted)?;
        }
        let table = format!("pgmq.q_{PGMQ_QUEUE}");
        for text in [format!("ALTER TABLE {table} SET (autovacuum_enabled = off)"), format!("VACUUM (ANALYZE) {table}")]
        {
            sqlx::raw_sql(sqlx::AssertSqlSafe(text)).execute(&self.pool).await.map_err(NotCommitted)?;
        }
        Ok(sqlx::raw_sql("CHECKPOINT").execute(&self.pool).await.is_ok())
    }

    /// Messages left in the bench's queue.
    pub async fn pgmq_queued(&self) -> Result<i64, StoreError> {
        let text = format!("SELECT CAST(COUNT(*) AS BIGINT) FROM pgmq.q_{PGMQ_QUEUE}");
        sqlx::query_scalar(sqlx::AssertSqlSafe(text)).fetch_one(&self.pool).await.map_err(NotCommitted)
    }

    /// Drops the bench's queue.
    pub async fn pgmq_drop_queue(&self) -> Result<(), StoreError> {
        sqlx::query(PGMQ_DROP_QUEUE).bind(PGMQ_QUEUE).execute(&self.pool).await.map_err(NotCommitted)?;
        Ok(())
    }

    /// A consumer of the bench's queue as pgmq's documentation shows one, until
    /// the queue is empty: `pgmq.read` of `batch_size` messages with a
    /// visibility timeout (pgmq's lease: its own commit); the effect in one
    /// transaction, the same effect haunt's workers commit (the inbox, which
    /// skips an event seen before, the projection, the ledger), the batch's
    /// messages sent back as one JSON parameter; then `pgmq.delete` of the
    /// batch (the ack: its own commit). Three commits a batch, as haunt's
    /// default protocol. `task` names this consumer in the ledger.
    pub async fn pgmq_drain(&self, task: usize, batch_size: i64) -> Result<(), StoreError> {
        self.assert_postgres();
        let worker = format!("pgmq-{task}");
        // Bounded by the queue: every round deletes the batch it read, and an
        // empty read ends the drain (every message is visible from the start
        // and none comes back while its consumer lives: the timeout is far
        // longer than a batch).
        loop {
            let read: Vec<(i64, i32, String)> = sqlx::query_as(PGMQ_READ)
                .bind(PGMQ_QUEUE)
                .bind(PGMQ_VISIBILITY_S)
                .bind(batch_size as i32)
                .fetch_all(&self.pool)
                .await
                .map_err(NotCommitted)?;
            if read.is_empty() {
                return Ok(());
            }
            let mut messages = String::from("[");
            let mut ids = String::new();
            for (i, (id, read_ct, message)) in read.iter().enumerate() {
                if i > 0 {
                    messages.push(',');
                    ids.push(',');
                }
                messages.push_str(&format!("{{\"m\":{message},\"attempt\":{read_ct}}}"));
                ids.push_str(&id.to_string());
            }
            messages.push(']');
            let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
            sqlx::query(PGMQ_APPLY).bind(&messages).bind(&worker).execute(&mut *tx).await.map_err(NotCommitted)?;
            tx.commit().await.map_err(CommitUnknown)?;
            sqlx::query(PGMQ_DELETE).bind(PGMQ_QUEUE).bind(&ids).execute(&self.pool).await.map_err(NotCommitted)?;
        }
    }
}

// The consumer over pgmq: pgmq's own functions, called as its README calls them.

const PGMQ_SCHEMA_EXISTS: &str =
    "SELECT CAST(COUNT(*) AS BIGINT) FROM information_schema.schemata WHERE schema_name = 'pgmq'";
const PGMQ_FUNCTIONS: &str = "SELECT CAST(COUNT(DISTINCT p.proname) AS BIGINT) FROM pg_proc p \
     JOIN pg_namespace n ON n.oid = p.pronamespace \
     WHERE n.nspname = 'pgmq' AND p.proname IN ('create', 'send_batch', 'read', 'delete')";
const PGMQ_CREATE: &str = "SELECT CAST(pgmq.create($1) AS TEXT)";
const PGMQ_DROP_QUEUE: &str = "SELECT CAST(pgmq.drop_queue($1) AS TEXT)";
/// $1 queue, $2 the messages as a JSON array.
const PGMQ_SEND_BATCH: &str = "SELECT CAST(COUNT(*) AS BIGINT) FROM pgmq.send_batch($1, \
     ARRAY(SELECT value FROM jsonb_array_elements(CAST($2 AS jsonb))))";
/// The visibility timeout of the read, in seconds: far longer than a batch.
const PGMQ_VISIBILITY_S: i32 = 30;
/// $1 queue, $2 visibility timeout (s), $3 batch size.
const PGMQ_READ: &str = "SELECT msg_id, read_ct, CAST(message AS TEXT) FROM pgmq.read($1, $2, $3)";
/// $1 queue, $2 the message ids, comma-separated.
const PGMQ_DELETE: &str = "SELECT CAST(COUNT(*) AS BIGINT) FROM pgmq.delete($1, \
     CAST(string_to_array($2, ',') AS BIGINT[]))";
/// $1 the batch (`[{"m": message, "attempt": read_ct}, …]`), $2 the consumer:
/// the inbox first (an event seen before is skipped), then the projection
/// and the ledger of the fresh ones, in the orders haunt's batches take, so
/// that two consumers never deadlock. The effect is the one haunt's workers
/// commit, order record included (issue 33): the projection row counts its
/// item's applications and each ledger row takes its item's next number,
/// in batch order.
const PGMQ_APPLY: &str = "WITH b AS (SELECT e->'m' AS p, CAST(e->>'attempt' AS INTEGER) AS attempt, ord \
       FROM json_array_elements(CAST($1 AS json)) WITH ORDINALITY AS j (e, ord)), \
     m AS (SELECT p->>'event_id' AS event_id, p->>'order_id' AS order_id, p->>'item_id' AS item_id, \
       CAST(p->>'qty' AS BIGINT) AS qty, attempt, ord FROM b), \
     fresh AS (INSERT INTO inbox_processed (event_id, deliveries, processed_at_ms) SELECT event_id, attempt, 0 FROM m \
       ORDER BY event_id ON CONFLICT DO NOTHING RETURNING event_id), \
     firsts AS (SELECT m.* FROM m JOIN fresh USING (event_id)), \
     agg AS (INSERT INTO inventory_projection (item_id, reserved_qty, applied_seq) \
       SELECT item_id, SUM(qty), COUNT(*) FROM firsts GROUP BY item_id ORDER BY item_id \
       ON CONFLICT (item_id) DO UPDATE SET reserved_qty = inventory_projection.reserved_qty + excluded.reserved_qty, \
       applied_seq = inventory_projection.applied_seq + excluded.applied_seq RETURNING item_id, applied_seq) \
     INSERT INTO projection_ledger (event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms, key_seq) \
     SELECT f.event_id, f.order_id, f.item_id, f.qty, f.attempt, $2, 0, \
       a.applied_seq - COUNT(*) OVER (PARTITION BY f.item_id) + ROW_NUMBER() OVER (PARTITION BY f.item_id ORDER BY f.ord) \
     FROM firsts f JOIN agg a USING (item_id)";

/// The end of the WAL inserted so far, as bytes (`pg_lsn` minus the origin is
/// a numeric, which sqlx's Any driver does not decode).
const WAL_POSITION: &str = "SELECT CAST(pg_current_wal_insert_lsn() - CAST('0/0' AS pg_lsn) AS BIGINT)";

/// The ledger's rows that carry their item's order record: distinct numbers
/// of one item, each within 1 and the count its projection row keeps.
const NUMBERED_LEDGER_ROWS: &str = "SELECT CAST(COUNT(*) AS BIGINT) FROM (SELECT DISTINCT l.item_id, l.key_seq \
     FROM projection_ledger l JOIN inventory_projection p ON p.item_id = l.item_id \
     WHERE l.key_seq BETWEEN 1 AND p.applied_seq) n";

/// The server-side limit's procedure (PostgreSQL), created by the bench.
const SERVER_SIDE_POSTGRES: &str = include_str!("../baseline/server_side_postgres.sql");
const DROP_SERVER_SIDE_POSTGRES: &str =
    "DROP PROCEDURE IF EXISTS haunt_bench_server_side_batch(bigint, text, boolean, boolean, bigint)";
/// $1 batch size, $2 worker id, $3 ack in the apply's transaction, $4 lease and
/// ack without waiting for the WAL flush. Answers the messages leased.
const SERVER_SIDE_CALL: &str = "CALL haunt_bench_server_side_batch($1, $2, $3, $4, NULL)";

/// The last value the ledger's id sequence handed out (`AUTOINCREMENT`'s
/// record of it on SQLite), 0 before the first.
const LEDGER_NUMBERED_POSTGRES: &str = "SELECT CAST(COALESCE(pg_sequence_last_value(\
     CAST(pg_get_serial_sequence('projection_ledger', 'id') AS regclass)), 0) AS BIGINT)";
const LEDGER_NUMBERED_SQLITE: &str = "SELECT CAST(COALESCE((SELECT seq FROM sqlite_sequence \
     WHERE name = 'projection_ledger'), 0) AS BIGINT)";
/// Leases update the queue's rows (`ROW EXCLUSIVE`, or `ROW SHARE` for `FOR
/// UPDATE`): `EXCLUSIVE` conflicts with both and with nothing a plain read takes.
const HOLD_QUEUE: &str = "LOCK TABLE queue_messages IN EXCLUSIVE MODE";

const LOCK_WAITERS: &str = "SELECT COUNT(*) FROM pg_stat_activity \
     WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'";

const BACKENDS_NAMED: &str = "SELECT CAST(pid AS BIGINT) FROM pg_stat_activity \
     WHERE datname = current_database() AND application_name = $1";

/// haunt's default visibility timeout (the worker's `visibility_timeout`).
const VISIBILITY_MS: i64 = 5_000;

// The server-side limit on SQLite: the batch lives in two temporary tables of
// the connection (the leased ids, then the held deliveries with their parsed
// payloads), so that no row crosses into Rust. SQLite's database clock, as
// sql::SQLITE has it.
macro_rules! sqlite_now {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
}
const SQLITE_TEMP_TABLES: [&str; 2] = [
    "CREATE TEMP TABLE IF NOT EXISTS haunt_bench_leased (message_id TEXT PRIMARY KEY)",
    // Keyed by event: a second copy of an event in one batch is left out of
    // the apply (haunt would count it as a duplicate); the ack still deletes it.
    "CREATE TEMP TABLE IF NOT EXISTS haunt_bench_batch (event_id TEXT PRIMARY KEY, message_id TEXT NOT NULL, \
     attempt INTEGER NOT NULL, order_id TEXT NOT NULL, item_id TEXT NOT NULL, qty INTEGER NOT NULL, \
     fresh INTEGER NOT NULL, ord INTEGER NOT NULL)",
];
const SQLITE_CLEAR_LEASED: &str = "DELETE FROM temp.haunt_bench_leased";
/// $1 batch size: the oldest visible messages.
const SQLITE_PICK: &str = concat!(
    "INSERT INTO temp.haunt_bench_leased (message_id) SELECT message_id FROM queue_messages ",
    "WHERE visible_at_ms <= ",
    sqlite_now!(),
    " ORDER BY visible_at_ms LIMIT $1"
);
/// $1 lease token, $2 visibility timeout in ms.
const SQLITE_LEASE: &str = concat!(
    "UPDATE queue_messages SET delivery_count = delivery_count + 1, lease_token = $1, ",
    "lease_until_ms = ",
    sqlite_now!(),
    " + $2, visible_at_ms = ",
    sqlite_now!(),
    " + $2 ",
    "WHERE message_id IN (SELECT message_id FROM temp.haunt_bench_leased)"
);
const SQLITE_CLEAR_BATCH: &str = "DELETE FROM temp.haunt_bench_batch";
/// $1 lease token: the leased rows it still holds, their payloads parsed, each
/// marked fresh when the inbox does not hold its event.
const SQLITE_HOLD: &str = "INSERT OR IGNORE INTO temp.haunt_bench_batch \
     (event_id, message_id, attempt, order_id, item_id, qty, fresh, ord) \
     SELECT q.event_id, q.message_id, q.delivery_count, json_extract(q.payload, '$.order_id'), \
     json_extract(q.payload, '$.item_id'), json_extract(q.payload, '$.qty'), \
     NOT EXISTS (SELECT 1 FROM inbox_processed i WHERE i.event_id = q.event_id), \
     row_number() OVER (ORDER BY q.enqueued_at_ms, q.message_id) \
     FROM queue_messages q WHERE q.message_id IN (SELECT message_id FROM temp.haunt_bench_leased) \
     AND q.lease_token = $1";
const SQLITE_INBOX: &str = concat!(
    "INSERT INTO inbox_processed (event_id, deliveries, processed_at_ms) SELECT event_id, attempt, ",
    sqlite_now!(),
    " FROM temp.haunt_bench_batch WHERE fresh ORDER BY event_id"
);
const SQLITE_DUPLICATES: &str = "UPDATE inbox_processed SET duplicates = duplicates + 1, \
     deliveries = max(deliveries, b.attempt) FROM temp.haunt_bench_batch b \
     WHERE b.event_id = inbox_processed.event_id AND NOT b.fresh";
/// The projection, with each item's count of applied events (the order
/// record, as the worker keeps it).
const SQLITE_PROJECTION: &str = "INSERT INTO inventory_projection (item_id, reserved_qty, applied_seq) \
     SELECT item_id, SUM(qty), COUNT(*) FROM temp.haunt_bench_batch WHERE fresh GROUP BY item_id ORDER BY item_id \
     ON CONFLICT (item_id) DO UPDATE SET reserved_qty = inventory_projection.reserved_qty + excluded.reserved_qty, \
     applied_seq = inventory_projection.applied_seq + excluded.applied_seq";
/// $1 worker id. Each new event numbered within its item, in batch order,
/// after the count the item's projection row holds (run before the
/// projection's upsert, in the same transaction).
const SQLITE_LEDGER: &str = concat!(
    "INSERT INTO projection_ledger (event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms, key_seq) ",
    "SELECT b.event_id, b.order_id, b.item_id, b.qty, b.attempt, $1, ",
    sqlite_now!(),
    ", COALESCE((SELECT p.applied_seq FROM inventory_projection p WHERE p.item_id = b.item_id), 0) ",
    "+ row_number() OVER (PARTITION BY b.item_id ORDER BY b.ord) ",
    "FROM temp.haunt_bench_batch b WHERE b.fresh ORDER BY b.ord"
);
/// $1 lease token: the leased messages it still holds.
const SQLITE_ACK: &str = "DELETE FROM queue_messages \
     WHERE message_id IN (SELECT message_id FROM temp.haunt_bench_leased) AND lease_token = $1";

// The client-side SQL baseline's statements, PostgreSQL's SQL.

const CLIENT_SQL_LEASE: &str = "UPDATE queue_messages SET delivery_count = delivery_count + 1, lease_token = $2, \
     lease_until_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + 30000, \
     visible_at_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + 30000 \
     WHERE message_id IN (SELECT message_id FROM queue_messages \
       WHERE visible_at_ms <= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) \
       ORDER BY visible_at_ms LIMIT $1 FOR UPDATE SKIP LOCKED) \
     RETURNING message_id";
/// The apply of both client-side variants: `m` names the batch's messages (event id
/// and parsed payload). The inbox insert goes in event order and the projection
/// upsert in item order, as haunt's batches do, so two batches never deadlock.
macro_rules! client_sql_apply {
    ($m:literal) => {
        concat!(
            "WITH m AS (", $m, "), ",
            "fresh AS (INSERT INTO inbox_processed (event_id, processed_at_ms) SELECT event_id, 0 FROM m ",
            "ORDER BY event_id ON CONFLICT DO NOTHING RETURNING event_id), ",
            "agg AS (INSERT INTO inventory_projection (item_id, reserved_qty) ",
            "SELECT m.p->>'item_id', SUM(CAST(m.p->>'qty' AS BIGINT)) FROM m JOIN fresh USING (event_id) ",
            "GROUP BY 1 ORDER BY 1 ",
            "ON CONFLICT (item_id) DO UPDATE SET reserved_qty = inventory_projection.reserved_qty + excluded.reserved_qty) ",
            "INSERT INTO projection_ledger (event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms) ",
            "SELECT m.event_id, m.p->>'order_id', m.p->>'item_id', CAST(m.p->>'qty' AS BIGINT), 1, 'client-sql', 0 ",
            "FROM m JOIN fresh USING (event_id)"
        )
    };
}

/// Fenced by the lease token ($1) over the leased ids ($2).
const CLIENT_SQL_APPLY_LEASED: &str = client_sql_apply!(
    "SELECT event_id, CAST(payload AS json) AS p FROM queue_messages \
     WHERE message_id = ANY(string_to_array($2, ',')) AND lease_token = $1 FOR UPDATE"
);
const CLIENT_SQL_ACK: &str =
    "DELETE FROM queue_messages WHERE lease_token = $1 AND message_id = ANY(string_to_array($2, ','))";

const CLIENT_SQL_LOCK: &str = "SELECT message_id, event_id, payload FROM queue_messages \
     WHERE visible_at_ms <= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) \
     ORDER BY visible_at_ms LIMIT $1 FOR UPDATE SKIP LOCKED";
const CLIENT_SQL_APPLY: &str = client_sql_apply!(
    "SELECT event_id, CAST(payload AS json) AS p FROM queue_messages \
     WHERE message_id IN (SELECT unnest(string_to_array($1, ',')))"
);
const CLIENT_SQL_DELETE: &str =
    "DELETE FROM queue_messages WHERE message_id IN (SELECT unnest(string_to_array($1, ',')))";

// The ingest baseline's statements, the same on both backends.

const RAW_INSERT_ORDER: &str = "INSERT INTO orders (order_id, item_id, qty, event_id, correlation_id, created_at_ms) \
     VALUES ($1, 'item-0', 1, $2, $1, $3)";
/// A message's headers as the API writes them: its correlation id, and the
/// `traceparent` of a sampled span in a trace of its own (message `i`'s), so
/// that a worker draining them continues one trace per message, as in a run.
fn headers_of(order_id: &str, i: usize) -> String {
    let traceparent = format!("00-{:016x}{:016x}-{:016x}-01", 0x6861_756e_7400_0000_u64, i + 1, i + 1);
    json!({"correlation_id": order_id, "traceparent": traceparent}).to_string()
}

const RAW_INSERT_MESSAGE: &str = "INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, visible_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $5)";
