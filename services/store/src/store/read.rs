//! Reading the store whole: emptiness, the projection, the queue's figures,
//! and the final state a run's checker reads.

use super::*;

impl Store {
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
        self.final_state(&mut |line| {
            lines.push(line);
            Ok(())
        })
        .await?;
        Ok(lines)
    }

    /// Streams the final state (every line of `final-state.jsonl` but `meta`,
    /// which only the harness can write) from one consistent snapshot.
    pub fn final_state<'a>(
        &'a self,
        sink: &'a mut (dyn FnMut(FinalLine) -> std::io::Result<()> + Send),
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        // Boxed here, so that the crates that await it do not each compile
        // the body again (see `Store::connect`).
        Box::pin(self.final_state_unboxed(sink))
    }

    async fn final_state_unboxed(
        &self,
        sink: &mut (dyn FnMut(FinalLine) -> std::io::Result<()> + Send),
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(NotCommitted)?;
        if self.kind == DbKind::Postgres {
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
                    key_seq: row.try_get::<Option<i64>, _>(7).map_err(&c)?.and_then(|s| u64::try_from(s).ok()),
                    publish_seq: row.try_get(8).map_err(&c)?,
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
