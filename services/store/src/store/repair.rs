//! Repairs from outside the delivery path: redrive dead letters, reconcile
//! the projection with the orders, and the test helpers that break it.

use super::*;

impl Store {
    /// Moves dead letters back to the queue (all of them, or one), visible
    /// now, with a fresh delivery count and their last error. Returns how many
    /// moved. The rows inserted are exactly the rows deleted, whatever parks
    /// or redrives run beside it: a message is never in neither table, nor
    /// copied twice.
    pub fn redrive<'a>(&'a self, message_id: Option<&'a str>) -> BoxFuture<'a, Result<u64, StoreError>> {
        // Boxed here, so that the crates that await it do not each compile
        // the body again (see `Store::connect`).
        Box::pin(self.redrive_unboxed(message_id))
    }

    async fn redrive_unboxed(&self, message_id: Option<&str>) -> Result<u64, StoreError> {
        if self.kind == DbKind::Postgres {
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
    pub fn reconcile(&self, dry_run: bool) -> BoxFuture<'_, Result<ReconcileReport, StoreError>> {
        // Boxed here, so that the crates that await it do not each compile
        // the body again (see `Store::connect`).
        Box::pin(self.reconcile_unboxed(dry_run))
    }

    async fn reconcile_unboxed(&self, dry_run: bool) -> Result<ReconcileReport, StoreError> {
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
}
