//! Delivering a message of the database queue: lease, apply (the inbox, the
//! projection and the ledger in one transaction, fenced by the lease token),
//! ack, retry and park.

use super::*;

impl Store {
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
        let mut leased: Vec<Leased> = rows.into_iter().map(|row| leased(row, &token)).collect();
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

        self.write_effect(&mut tx, &first_copies, worker_id).await?;
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

    /// The effect of a batch's new events: one projection write per item,
    /// with the sum of its new events and their count, then one ledger row
    /// per application, numbered within its item in batch order up to the
    /// item's count after this batch.
    async fn write_effect(
        &self,
        conn: &mut sqlx::AnyConnection,
        first_copies: &[(&Leased, &OrderEvent)],
        worker_id: &str,
    ) -> Result<(), StoreError> {
        let mut per_item: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for (_, event) in first_copies {
            let (qty, events) = per_item.entry(event.item_id.as_str()).or_default();
            *qty += event.qty;
            *events += 1;
        }
        let items: Vec<(&str, i64, i64)> = per_item.into_iter().map(|(item, (qty, n))| (item, qty, n)).collect();
        // Each item's count of applied events after this batch.
        let mut counted: HashMap<String, i64> = HashMap::with_capacity(items.len());
        if self.bug == Some(Bug::ReadModifyWriteProjection) {
            // BUG MODE read-modify-write-projection: read, add, write back. Two
            // workers on the same item both read the old value; one update is lost.
            for (item, qty, events) in &items {
                let current: Option<i64> = sqlx::query_scalar(sql::READ_PROJECTION_ROW)
                    .bind(*item)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(NotCommitted)?;
                sqlx::query(sql::SET_PROJECTION)
                    .bind(*item)
                    .bind(current.unwrap_or(0) + qty)
                    .execute(&mut *conn)
                    .await
                    .map_err(NotCommitted)?;
                let seq: i64 = sqlx::query_scalar(sql::COUNT_APPLIED)
                    .bind(*item)
                    .bind(events)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(NotCommitted)?;
                counted.insert((*item).to_owned(), seq);
            }
        } else if !items.is_empty() {
            let rows = sqlx::query(self.dialect.add_to_projection)
                .bind(json_rows(&items))
                .fetch_all(&mut *conn)
                .await
                .map_err(NotCommitted)?;
            for row in rows {
                let c = corrupt("inventory_projection");
                counted.insert(row.try_get(0).map_err(&c)?, row.try_get(1).map_err(&c)?);
            }
        }

        if !first_copies.is_empty() {
            let mut next: HashMap<&str, i64> = HashMap::with_capacity(items.len());
            for (item, _, events) in &items {
                let after = counted.get(*item).ok_or_else(|| StoreError::Corrupt {
                    table: "inventory_projection",
                    why: format!("no count returned for item {item}"),
                })?;
                next.insert(*item, after - events + 1);
            }
            type LedgerRow<'r> = (&'r str, &'r str, &'r str, i64, i64, i64, Option<i64>);
            let rows: Vec<LedgerRow<'_>> = first_copies
                .iter()
                .map(|(l, e)| {
                    let seq = next.get_mut(e.item_id.as_str()).expect("every item of the batch is counted");
                    *seq += 1;
                    let (event, order, item) = (e.event_id.as_str(), e.order_id.as_str(), e.item_id.as_str());
                    (event, order, item, e.qty, l.delivery_count, *seq - 1, l.headers.publish_seq)
                })
                .collect();
            sqlx::query(self.dialect.insert_ledger)
                .bind(json_rows(&rows))
                .bind(worker_id)
                .execute(&mut *conn)
                .await
                .map_err(NotCommitted)?;
        }
        Ok(())
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
        // Found where the lease left them when it said where for every one.
        let ctids: Option<Vec<&str>> =
            fence.and_then(|_| deliveries.iter().map(|(leased, _)| leased.ctid.as_deref()).collect());
        let statement = match (fence, &ctids) {
            (Some(_), Some(_)) => sql::APPLY_BATCH_AT_POSTGRES,
            (Some(_), None) => sql::APPLY_BATCH_POSTGRES,
            (None, _) => sql::APPLY_DELIVERIES_POSTGRES,
        };
        let n = deliveries.len();
        let (mut ids, mut events, mut attempts) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut orders, mut items, mut qtys) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        let mut published: Vec<Option<i64>> = Vec::with_capacity(n);
        for (leased, event) in deliveries {
            published.push(leased.headers.publish_seq);
            ids.push(leased.message_id.as_str());
            events.push(event.event_id.as_str());
            attempts.push(leased.delivery_count);
            orders.push(event.order_id.as_str());
            items.push(event.item_id.as_str());
            qtys.push(event.qty);
        }
        let mut query = sqlx::query_as(statement)
            .bind(fence)
            .bind(&ids)
            .bind(&events)
            .bind(&attempts)
            .bind(&orders)
            .bind(&items)
            .bind(&qtys)
            .bind(worker_id)
            .bind(ack == AckMode::InApplyTxn)
            .bind(&published);
        if let Some(ctids) = &ctids {
            query = query.bind(ctids);
        }
        let rows: Vec<(String, String, Option<i64>)> =
            query.fetch_all(pg).await.map_err(|e| match fetched("inbox_processed")(e) {
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

    /// [`Store::ack_batch`] for messages of one lease with where the lease
    /// left their rows (`(id, ctid)`, from [`Leased::ctid`]): PostgreSQL
    /// deletes them there, without looking each id up. By id where an
    /// address is missing, on SQLite, and under `no-lease-token`, whose ack
    /// acts on whoever holds a message, wherever a later lease moved it.
    pub async fn ack_leased(&self, acks: &[(&str, Option<&str>)], lease_token: &str) -> Result<u64, StoreError> {
        let ctids: Option<Vec<&str>> = acks.iter().map(|(_, ctid)| *ctid).collect();
        let pg = self.pg_settle.as_ref().or(self.pg.as_ref());
        match (pg, ctids, self.holder(Some(lease_token))) {
            (Some(pg), Some(ctids), Some(token)) if !ctids.is_empty() => {
                let deleted = sqlx::query(sql::ACK_BATCH_AT_POSTGRES).bind(token).bind(&ctids).execute(pg).await;
                Ok(deleted.map_err(NotCommitted)?.rows_affected())
            }
            _ => {
                let ids: Vec<&str> = acks.iter().map(|(id, _)| *id).collect();
                self.ack_batch(&ids, lease_token).await
            }
        }
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
}
