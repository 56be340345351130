//! Placing an order: the order row and its message in one transaction, and
//! reading an order back.

use super::*;

impl Store {
    /// Writes the order and its message in one transaction. The order id is the
    /// idempotency key: the same order again is a replay, other content a conflict.
    pub async fn place_order(&self, new: &NewOrder) -> Result<Placement, StoreError> {
        let event_id = Uuid::new_v4().to_string();
        if self.kind == DbKind::Postgres && !matches!(self.bug, Some(Bug::AsyncCommit | Bug::NonAtomicEnqueue)) {
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
        let headers = Headers {
            correlation_id: new.correlation_id.clone(),
            traceparent: new.traceparent.clone(),
            publish_seq: None,
        };
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

    pub(super) async fn enqueue(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        new: &NewOrder,
        event: &OrderEvent,
    ) -> Result<(), StoreError> {
        if self.injected.roll() {
            return Err(injected());
        }
        let payload = serde_json::to_string(event).expect("an event serializes");
        let headers = Headers {
            correlation_id: new.correlation_id.clone(),
            traceparent: new.traceparent.clone(),
            publish_seq: None,
        };
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
}
