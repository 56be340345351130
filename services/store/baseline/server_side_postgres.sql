-- The server-side limit of `haunt bench pipeline` on PostgreSQL: haunt's own
-- protocol on haunt's own tables, run entirely inside the database, one CALL
-- per batch. Nothing crosses the wire but the call and its count, so what this
-- reaches is what the database can do with haunt's protocol: the limit that
-- haunt's workers are measured against.
--
-- Per batch, as haunt's worker does it (services/store/src/store/deliver.rs):
--   1. lease: up to batch_size visible messages, oldest first, skipping rows
--      another consumer holds; each gets a fresh lease token, its delivery
--      count goes up and it turns invisible for the visibility timeout.
--      COMMIT, so that the lease means something to the others.
--   2. apply, fenced by the lease: lock the batch's rows the token still
--      holds, insert their events into the inbox in event order (conflicts are
--      duplicates, counted on the inbox row), upsert the projection once per
--      item in item order with the sum of the new events, write one ledger row
--      per new event, numbered within its item (key_seq) from the count the
--      projection row keeps (applied_seq), as the worker's apply has done since
--      2026-12-04 (issue 33). The payload is parsed here, once per message, as
--      the worker parses it. (Without a relay the worker's publish_seq is NULL,
--      as it is here.)
--   3. ack: delete the held messages, fenced by the token. COMMIT.
-- The fence and the ack find the rows where the lease left them (their ctid),
-- as the worker does since 2026-12-07, not by primary key.
-- With ack_in_effect the delete joins the apply's transaction: two commits per
-- batch instead of three. With async_lease_ack the lease's and the ack's
-- commits do not wait for the WAL flush (synchronous_commit = off), the apply's
-- does: what a lost lease or ack costs is a redelivery, which the inbox absorbs.
--
-- The bench creates this procedure when it runs (CREATE OR REPLACE) and drops
-- it at the end; it is not part of the schema. Plain SQL and PL/pgSQL, ours.
CREATE OR REPLACE PROCEDURE haunt_bench_server_side_batch(
    batch_size bigint,
    worker text,
    ack_in_effect boolean,
    async_lease_ack boolean,
    INOUT leased bigint DEFAULT NULL
)
LANGUAGE plpgsql
AS $$
DECLARE
    -- One lease token per batch, as the worker draws one per lease.
    token text := CAST(gen_random_uuid() AS text);
    -- haunt's default visibility timeout (WorkerConfig::visibility_timeout).
    visibility_ms constant bigint := 5000;
    ids text[];
    events text[];
    attempts bigint[];
    order_ids text[];
    item_ids text[];
    qtys bigint[];
    held text[];
    -- Where each leased row is, and each held one.
    tids tid[];
    held_tids tid[];
BEGIN
    -- 1. Lease. The picked rows' addresses as an array (`ctid =
    -- ANY(ARRAY(…))`), so that the update fetches them where the pick found
    -- (and locked) them; `IN (SELECT …)` plans a hash semi-join over a scan
    -- of the whole queue.
    IF async_lease_ack THEN
        SET LOCAL synchronous_commit = off;
    END IF;
    WITH l AS (
        UPDATE queue_messages
        SET delivery_count = delivery_count + 1,
            lease_token = token,
            lease_until_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS bigint) + visibility_ms,
            visible_at_ms = CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS bigint) + visibility_ms
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM queue_messages
            WHERE visible_at_ms <= CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS bigint)
            ORDER BY visible_at_ms
            LIMIT batch_size
            FOR UPDATE SKIP LOCKED))
        RETURNING message_id, event_id, payload, delivery_count, enqueued_at_ms, ctid
    )
    SELECT array_agg(l.message_id ORDER BY l.enqueued_at_ms, l.message_id),
           array_agg(l.event_id ORDER BY l.enqueued_at_ms, l.message_id),
           array_agg(l.delivery_count ORDER BY l.enqueued_at_ms, l.message_id),
           array_agg(p.order_id ORDER BY l.enqueued_at_ms, l.message_id),
           array_agg(p.item_id ORDER BY l.enqueued_at_ms, l.message_id),
           array_agg(p.qty ORDER BY l.enqueued_at_ms, l.message_id),
           array_agg(l.ctid)
    INTO ids, events, attempts, order_ids, item_ids, qtys, tids
    FROM l CROSS JOIN LATERAL json_to_record(CAST(l.payload AS json)) AS p(order_id text, item_id text, qty bigint);
    COMMIT;
    IF ids IS NULL THEN
        leased := 0;
        RETURN;
    END IF;

    -- 2. Apply, fenced: the rows the lease still holds, locked where the
    -- lease left them.
    SELECT array_agg(h.message_id), array_agg(h.ctid) INTO held, held_tids
    FROM (SELECT message_id, ctid FROM queue_messages
          WHERE ctid = ANY(tids) AND lease_token = token
          FOR UPDATE) h;
    IF held IS NOT NULL THEN
        -- The held deliveries: a join, not `= ANY(held)` in a filter, which
        -- compares every message with every held id (quadratic in the batch).
        WITH b AS (
            SELECT u.* FROM unnest(ids, events, attempts, order_ids, item_ids, qtys)
                WITH ORDINALITY AS u(message_id, event_id, attempt, order_id, item_id, qty, ord)
            JOIN unnest(held) AS h(message_id) USING (message_id)
        ),
        fresh AS (
            INSERT INTO inbox_processed (event_id, deliveries, processed_at_ms)
            SELECT DISTINCT ON (b.event_id) b.event_id, b.attempt,
                   CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS bigint)
            FROM b ORDER BY b.event_id, b.ord
            ON CONFLICT (event_id) DO NOTHING
            RETURNING event_id
        ),
        -- Each new event once, its first copy in batch order.
        firsts AS (
            SELECT DISTINCT ON (b.event_id) b.* FROM b JOIN fresh USING (event_id)
            ORDER BY b.event_id, b.ord
        ),
        -- Deliveries of events the inbox already held (a lost ack, a zombie).
        -- A second copy inside one batch is not counted here: the inbox row
        -- it would count on is this statement's own insert, which no other
        -- part of the statement sees. The bench's drains have no duplicates.
        dups AS (
            UPDATE inbox_processed i
            SET duplicates = i.duplicates + d.n, deliveries = GREATEST(i.deliveries, d.attempt)
            FROM (SELECT b.event_id, count(*) AS n, max(b.attempt) AS attempt FROM b
                  WHERE NOT EXISTS (SELECT 1 FROM fresh f WHERE f.event_id = b.event_id)
                  GROUP BY b.event_id ORDER BY b.event_id) d
            WHERE i.event_id = d.event_id
        ),
        -- The order record, as the worker keeps it: each item's row counts
        -- its applied events, and each new event's ledger row takes its
        -- item's next number from that count, in batch order.
        projection AS (
            INSERT INTO inventory_projection (item_id, reserved_qty, applied_seq)
            SELECT firsts.item_id, SUM(firsts.qty), COUNT(*) FROM firsts GROUP BY firsts.item_id ORDER BY firsts.item_id
            ON CONFLICT (item_id) DO UPDATE
            SET reserved_qty = inventory_projection.reserved_qty + excluded.reserved_qty,
                applied_seq = inventory_projection.applied_seq + excluded.applied_seq
            RETURNING item_id, applied_seq
        )
        INSERT INTO projection_ledger
            (event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms, key_seq)
        SELECT f.event_id, f.order_id, f.item_id, f.qty, f.attempt, worker,
               CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS bigint),
               p.applied_seq - COUNT(*) OVER (PARTITION BY f.item_id)
                   + ROW_NUMBER() OVER (PARTITION BY f.item_id ORDER BY f.ord)
        FROM firsts f JOIN projection p USING (item_id) ORDER BY f.ord;
    END IF;

    -- 3. Ack: its own transaction, or the apply's.
    IF NOT ack_in_effect THEN
        COMMIT;
        IF async_lease_ack THEN
            SET LOCAL synchronous_commit = off;
        END IF;
    END IF;
    IF held IS NOT NULL THEN
        DELETE FROM queue_messages WHERE ctid = ANY(held_tids) AND lease_token = token;
    END IF;
    COMMIT;
    leased := cardinality(ids);
END
$$;
