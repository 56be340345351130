//! [`Baseline`]: the raw-SQL baselines of `haunt bench pipeline`.
//!
//! These are benchmark baselines, not part of the pipeline: hand-written SQL
//! that speaks the pipeline's tables directly, so the bench can set what the
//! database can do beside what haunt's worker and API do. They live in the
//! store, not in the bench, so that the architecture invariant holds: only this
//! crate reads or writes those tables, and a change of schema is made, and
//! seen, in one place. Nothing of the service uses them.
//!
//! A [`Baseline`] has a pool of its own (no pragmas, no acquire timeout beyond
//! sqlx's), as the bench always had, so the figures it reports stay comparable
//! with the ones measured before the baselines moved here.

use serde_json::json;
use sqlx::AnyPool;

use crate::Backend;
use crate::StoreError;
use crate::StoreError::{CommitUnknown, NotCommitted};
use crate::sql;

/// Rows per multi-row insert while pre-enqueuing: 6 binds a row, far below
/// both backends' limits on bound parameters, and large enough that the setup
/// costs a few seconds at most.
const ENQUEUE_CHUNK: usize = 500;

/// The pipeline's tables, emptied between the bench's phases.
const TABLES: [&str; 6] =
    ["orders", "queue_messages", "inbox_processed", "inventory_projection", "projection_ledger", "dead_letters"];

/// The raw baselines over a pool of their own.
#[derive(Debug, Clone)]
pub struct Baseline {
    pool: AnyPool,
    backend: Backend,
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
}

/// The clock of the process, in ms since the epoch: the baselines stamp rows as
/// a client would, not with the database clock.
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Baseline {
    /// A pool of `max_connections` on `url`. The store must have been opened
    /// (and so migrated) on it first.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Baseline, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::from_url(url)?;
        let pool = sqlx::any::AnyPoolOptions::new()
            .max_connections(max_connections)
            .connect(url)
            .await
            .map_err(StoreError::Connect)?;
        Ok(Baseline { pool, backend })
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Empties the pipeline's tables. On PostgreSQL by TRUNCATE, so that no
    /// phase pays for the dead rows of the one before it.
    pub async fn reset(&self) -> Result<(), StoreError> {
        if self.backend == Backend::Postgres {
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

    /// Writes `n` orders (`b-I`, over `items` items, one each) and their
    /// messages, visible at once, as the API would have.
    pub async fn enqueue(&self, n: usize, items: usize) -> Result<(), StoreError> {
        // A second in the past: visible whatever the small skew between clocks.
        let at = now_ms() - 1_000;
        for start in (0..n).step_by(ENQUEUE_CHUNK) {
            let rows = ENQUEUE_CHUNK.min(n - start);
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
                let headers = json!({"correlation_id": order_id});
                o = o.bind(order_id.clone()).bind(item_id).bind(1i64).bind(event_id.clone()).bind(order_id).bind(at);
                m = m
                    .bind(format!("m-{i}"))
                    .bind(event_id)
                    .bind(payload.to_string())
                    .bind(headers.to_string())
                    .bind(at)
                    .bind(at);
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
        })
    }

    /// Whether the raw ceilings ([`Baseline::raw_drain`],
    /// [`Baseline::raw_one_txn_drain`]) can run here: they read the JSON payload
    /// in SQL and lock with `SKIP LOCKED`, which is PostgreSQL's only.
    pub fn has_raw_ceiling(&self) -> bool {
        self.backend == Backend::Postgres
    }

    fn assert_postgres(&self) {
        // The bench asks has_raw_ceiling first; calling on SQLite is its bug.
        assert!(self.has_raw_ceiling(), "the raw ceiling is PostgreSQL's only");
    }

    /// The ceiling: the pipeline's protocol in hand-written SQL, `batch_size`
    /// at a time, until the queue is empty: lease (a committed lease token
    /// and visibility timeout, so that a crash hands the batch on), apply (one
    /// statement, fenced by the token), delete. `task` makes the tokens unique.
    /// PostgreSQL only.
    pub async fn raw_drain(&self, task: usize, batch_size: i64) -> Result<(), StoreError> {
        self.assert_postgres();
        // Bounded by the queue: every round deletes the batch it leased, and an
        // empty lease ends the drain.
        for batch in 0.. {
            let token = format!("raw-{task}-{batch}");
            let ids: Vec<String> = sqlx::query_scalar(RAW_LEASE)
                .bind(batch_size)
                .bind(&token)
                .fetch_all(&self.pool)
                .await
                .map_err(NotCommitted)?;
            if ids.is_empty() {
                break;
            }
            let list = ids.join(",");
            sqlx::query(RAW_APPLY_LEASED).bind(&token).bind(&list).execute(&self.pool).await.map_err(NotCommitted)?;
            sqlx::query(RAW_ACK).bind(&token).bind(&list).execute(&self.pool).await.map_err(NotCommitted)?;
        }
        Ok(())
    }

    /// A stronger baseline, shown beside the ceiling: no lease at all, the
    /// batch's rows locked (`FOR UPDATE SKIP LOCKED`) from the read to the
    /// delete in one transaction. One commit per batch instead of three, but a
    /// consumer that holds row locks while it works, which is not the
    /// visibility-timeout protocol haunt tests. PostgreSQL only.
    pub async fn raw_one_txn_drain(&self, batch_size: i64) -> Result<(), StoreError> {
        self.assert_postgres();
        // Bounded by the queue, as raw_drain is.
        loop {
            let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
            let ids: Vec<String> =
                sqlx::query_scalar(RAW_LOCK).bind(batch_size).fetch_all(&mut *tx).await.map_err(NotCommitted)?;
            if ids.is_empty() {
                tx.commit().await.map_err(CommitUnknown)?;
                return Ok(());
            }
            let list = ids.join(",");
            sqlx::query(RAW_APPLY).bind(&list).execute(&mut *tx).await.map_err(NotCommitted)?;
            sqlx::query(RAW_DELETE).bind(&list).execute(&mut *tx).await.map_err(NotCommitted)?;
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
            let headers = json!({"correlation_id": order_id}).to_string();
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

// The ceiling's statements, PostgreSQL's SQL.

const RAW_LEASE: &str = "UPDATE queue_messages SET delivery_count = delivery_count + 1, lease_token = $2, \
     lease_until_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + 30000, \
     visible_at_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) + 30000 \
     WHERE message_id IN (SELECT message_id FROM queue_messages \
       WHERE visible_at_ms <= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) \
       ORDER BY visible_at_ms LIMIT $1 FOR UPDATE SKIP LOCKED) \
     RETURNING message_id";
/// The apply of both raw variants: `m` names the batch's messages (event id
/// and parsed payload). The inbox insert goes in event order and the projection
/// upsert in item order, as haunt's batches do, so two batches never deadlock.
macro_rules! raw_apply {
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
            "SELECT m.event_id, m.p->>'order_id', m.p->>'item_id', CAST(m.p->>'qty' AS BIGINT), 1, 'raw', 0 ",
            "FROM m JOIN fresh USING (event_id)"
        )
    };
}

/// Fenced by the lease token ($1) over the leased ids ($2).
const RAW_APPLY_LEASED: &str = raw_apply!(
    "SELECT event_id, CAST(payload AS json) AS p FROM queue_messages \
     WHERE message_id = ANY(string_to_array($2, ',')) AND lease_token = $1 FOR UPDATE"
);
const RAW_ACK: &str =
    "DELETE FROM queue_messages WHERE lease_token = $1 AND message_id = ANY(string_to_array($2, ','))";

const RAW_LOCK: &str = "SELECT message_id, event_id, payload FROM queue_messages \
     WHERE visible_at_ms <= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) \
     ORDER BY visible_at_ms LIMIT $1 FOR UPDATE SKIP LOCKED";
const RAW_APPLY: &str = raw_apply!(
    "SELECT event_id, CAST(payload AS json) AS p FROM queue_messages \
     WHERE message_id IN (SELECT unnest(string_to_array($1, ',')))"
);
const RAW_DELETE: &str = "DELETE FROM queue_messages WHERE message_id IN (SELECT unnest(string_to_array($1, ',')))";

// The ingest baseline's statements, the same on both backends.

const RAW_INSERT_ORDER: &str = "INSERT INTO orders (order_id, item_id, qty, event_id, correlation_id, created_at_ms) \
     VALUES ($1, 'item-0', 1, $2, $1, $3)";
const RAW_INSERT_MESSAGE: &str = "INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, visible_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $5)";
