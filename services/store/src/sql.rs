//! The SQL, one text for both backends where they agree (sqlx binds `$N` on
//! SQLite too) and one per backend where they do not: the database clock and the
//! lease lock.

/// Statements whose text depends on the backend.
#[derive(Debug)]
pub struct Dialect {
    /// Milliseconds since the Unix epoch from the database clock.
    pub now: &'static str,
    /// The same clock as an expression, for statements built at run time.
    pub clock: &'static str,
    pub lease: &'static str,
    /// The relay's lease when its broker keeps each key's order: the oldest
    /// rows in the order they were written, and none while another lease
    /// holds rows (one batch in flight, so nothing older can be published
    /// after it). $1 batch size, $2 lease token, $3 visibility timeout in
    /// ms; returns the lease's columns and the row's place in the outbox.
    pub lease_in_order: &'static str,
    /// Gives back every row of lease `$1` at once, visible now.
    pub release: &'static str,
    pub place_order: &'static str,
    pub enqueue: &'static str,
    pub retry_later: &'static str,
    pub dead_letter: &'static str,
    pub queue_stats: &'static str,
    pub dead_letter_count: &'static str,
    /// Takes the write lock that keeps appliers out while reconcile recomputes.
    pub reconcile_lock: &'static str,
    /// The stepwise apply and ack. Each takes its batch as one JSON array in
    /// `$1`, read in the database (`json_each`, `json_array_elements`), never
    /// one bound parameter per row: SQLite looks a parameter's name up by a
    /// scan of the statement's list of names, once per bound parameter, and
    /// a ledger insert of 500 rows binds 3,000 of them (a third of a SQLite
    /// worker's CPU went to that scan; see docs/performance.md).
    ///
    /// The fence: locks and names the rows of the batch (`$1`, its message
    /// ids) that the lease `$2` still holds. PostgreSQL locks them against a
    /// new lease, and finds them by primary key (`= ANY(ARRAY(…))`: this
    /// stepwise path runs there only under the bug modes, whose switches sit
    /// between the steps; the one-statement apply finds them where the lease
    /// left them); SQLite needs a write first, so that the transaction holds
    /// the database's write lock before it reads.
    pub hold: &'static str,
    /// `$1` `[[event id, delivery count], …]` into the inbox, in that order;
    /// returns the events that were new and when they were processed.
    pub insert_inbox: &'static str,
    /// `$1` `[[item, quantity, events], …]` added to the projection; returns
    /// each item's count of applied events after it.
    pub add_to_projection: &'static str,
    /// `$1` `[[event id, order id, item, quantity, delivery count, key
    /// seq], …]` into the ledger, applied by worker `$2` now.
    pub insert_ledger: &'static str,
    /// Deletes the messages `$1` (their ids) that `$2` holds (any holder when
    /// NULL).
    pub delete_held: &'static str,
}

macro_rules! dialect {
    (
        $now:literal,
        ($batch_open:literal, $batch_close:literal),
        $skip_locked:literal,
        lease_by: ($lease_key:literal, $lease_row:literal),
        $reconcile_lock:literal,
        hold: ($hold_open:literal, $hold_close:literal),
        json: (ids: $ids:literal, rows: $rows:literal),
        written: $written:literal
    ) => {
        Dialect {
            now: concat!("SELECT ", $now),
            clock: $now,
            // $1 batch size, $2 worker clock (NULL: database clock), $3 lease token,
            // $4 visibility timeout in ms.
            lease: concat!(
                "UPDATE queue_messages SET delivery_count = delivery_count + 1, lease_token = $3, ",
                "lease_until_ms = COALESCE($2, ", $now, ") + $4, ",
                "visible_at_ms = COALESCE($2, ", $now, ") + $4 ",
                "WHERE ", $lease_key, " ", $batch_open, "SELECT ", $lease_key, " FROM queue_messages ",
                "WHERE visible_at_ms <= COALESCE($2, ", $now, ") ",
                "ORDER BY visible_at_ms LIMIT $1", $skip_locked, $batch_close, " ",
                "RETURNING message_id, event_id, payload, headers, delivery_count, lease_until_ms, enqueued_at_ms, ",
                $lease_row
            ),
            lease_in_order: concat!(
                "UPDATE queue_messages SET delivery_count = delivery_count + 1, lease_token = $2, ",
                "lease_until_ms = ", $now, " + $3, visible_at_ms = ", $now, " + $3 ",
                "WHERE message_id ", $batch_open, "SELECT message_id FROM queue_messages ",
                "WHERE visible_at_ms <= ", $now, " AND NOT EXISTS (SELECT 1 FROM queue_messages h ",
                "WHERE h.lease_token IS NOT NULL AND h.visible_at_ms > ", $now, ") ",
                "ORDER BY enqueued_at_ms, ", $written, " LIMIT $1", $skip_locked, $batch_close, " ",
                "RETURNING message_id, event_id, payload, headers, delivery_count, lease_until_ms, enqueued_at_ms, ",
                "CAST(", $written, " AS BIGINT)"
            ),
            release: concat!(
                "UPDATE queue_messages SET visible_at_ms = ", $now, ", lease_until_ms = NULL, lease_token = NULL ",
                "WHERE lease_token = $1"
            ),
            place_order: concat!(
                "INSERT INTO orders (order_id, item_id, qty, event_id, correlation_id, created_at_ms) ",
                "VALUES ($1, $2, $3, $4, $5, ", $now, ") ON CONFLICT (order_id) DO NOTHING"
            ),
            enqueue: concat!(
                "INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, visible_at_ms) ",
                "VALUES ($1, $2, $3, $4, ", $now, ", ", $now, ")"
            ),
            // $1 message, $2 token (NULL: any holder), $3 backoff ms, $4 error.
            retry_later: concat!(
                "UPDATE queue_messages SET visible_at_ms = ", $now, " + $3, lease_until_ms = NULL, ",
                "lease_token = NULL, last_error = $4 ",
                "WHERE message_id = $1 AND ($2 IS NULL OR lease_token = $2)"
            ),
            dead_letter: concat!(
                "INSERT INTO dead_letters (message_id, event_id, payload, headers, enqueued_at_ms, delivery_count, last_error, dead_at_ms) ",
                "SELECT message_id, event_id, payload, headers, enqueued_at_ms, delivery_count, $3, ", $now, " ",
                "FROM queue_messages WHERE message_id = $1 AND ($2 IS NULL OR lease_token = $2) ",
                "AND NOT EXISTS (SELECT 1 FROM inbox_processed i WHERE i.event_id = queue_messages.event_id)"
            ),
            // One `now` for every row and column, and the three states split
            // one condition: PostgreSQL's clock moves within a statement, and
            // a lease that expired between two readings of it once counted
            // as neither visible nor leased, so a queue holding a message
            // looked drained.
            queue_stats: concat!(
                "SELECT ",
                "CAST(COALESCE(SUM(CASE WHEN visible_at_ms <= t.now THEN 1 ELSE 0 END), 0) AS BIGINT), ",
                "CAST(COALESCE(SUM(CASE WHEN visible_at_ms > t.now AND lease_token IS NOT NULL THEN 1 ELSE 0 END), 0) AS BIGINT), ",
                "CAST(COALESCE(SUM(CASE WHEN visible_at_ms > t.now AND lease_token IS NULL THEN 1 ELSE 0 END), 0) AS BIGINT), ",
                "CAST(COALESCE(MAX(t.now) - MIN(enqueued_at_ms), 0) AS BIGINT) ",
                "FROM queue_messages CROSS JOIN (SELECT ", $now, " AS now) t"
            ),
            dead_letter_count: "SELECT CAST(COUNT(*) AS BIGINT) FROM dead_letters",
            reconcile_lock: $reconcile_lock,
            hold: concat!(
                $hold_open, " WHERE lease_token = $2 AND message_id ", $ids, $hold_close
            ),
            insert_inbox: concat!(
                "INSERT INTO inbox_processed (event_id, deliveries, processed_at_ms) ",
                "SELECT value ->> 0, CAST(value ->> 1 AS BIGINT), ", $now, " FROM ", $rows, " WHERE true ORDER BY key ",
                "ON CONFLICT (event_id) DO NOTHING RETURNING event_id, processed_at_ms"
            ),
            // (`ORDER BY key`: in the array's order, which is the caller's, so
            // that two transactions take the same keys in one order. `WHERE
            // true`: SQLite would read the `ON` of `ON CONFLICT` after a bare
            // `FROM` as a join's.)
            add_to_projection: concat!(
                "INSERT INTO inventory_projection (item_id, reserved_qty, applied_seq) ",
                "SELECT value ->> 0, CAST(value ->> 1 AS BIGINT), CAST(value ->> 2 AS BIGINT) FROM ", $rows,
                " WHERE true ORDER BY key ",
                "ON CONFLICT (item_id) DO UPDATE ",
                "SET reserved_qty = inventory_projection.reserved_qty + excluded.reserved_qty, ",
                "applied_seq = inventory_projection.applied_seq + excluded.applied_seq ",
                "RETURNING item_id, applied_seq"
            ),
            insert_ledger: concat!(
                "INSERT INTO projection_ledger ",
                "(event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms, key_seq, publish_seq) ",
                "SELECT value ->> 0, value ->> 1, value ->> 2, CAST(value ->> 3 AS BIGINT), ",
                "CAST(value ->> 4 AS BIGINT), $2, ", $now, ", CAST(value ->> 5 AS BIGINT), CAST(value ->> 6 AS BIGINT) ",
                "FROM ", $rows, " ORDER BY key"
            ),
            delete_held: concat!(
                "DELETE FROM queue_messages WHERE ($2 IS NULL OR lease_token = $2) AND message_id ", $ids
            ),
        }
    };
}

/// PostgreSQL finds the leased batch where the subquery found it: `ctid =
/// ANY(ARRAY(…))` fetches the rows the subquery picked and locked by their
/// addresses, with no look-up of each id in the primary key (and `IN (SELECT
/// …)` would plan a hash semi-join over a scan of the whole queue: 17,500
/// rows read to lease 500 of 20,000, see docs/performance.md). The lease
/// returns each row's new address, which the apply's fence and the ack find
/// it by ([`APPLY_BATCH_AT_POSTGRES`], [`ACK_BATCH_AT_POSTGRES`]).
pub const POSTGRES: Dialect = dialect!(
    "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    ("= ANY(ARRAY(", "))"),
    " FOR UPDATE SKIP LOCKED",
    lease_by: ("ctid", "CAST(ctid AS TEXT)"),
    "LOCK TABLE inventory_projection IN EXCLUSIVE MODE",
    hold: ("SELECT message_id FROM queue_messages", " FOR UPDATE"),
    json: (
        ids: "= ANY(ARRAY(SELECT json_array_elements_text($1::json)))",
        rows: "json_array_elements($1::json) WITH ORDINALITY AS j (value, key)"
    ),
    written: "seq"
);

/// PostgreSQL only: the order and its message in one statement (one round trip,
/// atomic like any statement). The message is written only if the order was:
/// a retried order id inserts nothing. $1 order id, $2 item, $3 qty, $4 event
/// id, $5 correlation id, $6 message id, $7 payload, $8 headers.
pub const PLACE_ORDER_AND_ENQUEUE_POSTGRES: &str = "WITH o AS (\
     INSERT INTO orders (order_id, item_id, qty, event_id, correlation_id, created_at_ms) \
     VALUES ($1, $2, $3, $4, $5, CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)) \
     ON CONFLICT (order_id) DO NOTHING RETURNING event_id, created_at_ms) \
     INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, visible_at_ms) \
     SELECT $6, event_id, $7, $8, created_at_ms, created_at_ms FROM o";

/// PostgreSQL only: a whole batch applied by one statement, atomic on its own
/// (it commits by itself), so the apply is one round trip instead of six
/// (`BEGIN`, fence, inbox, projection, ledger, `COMMIT`). The batch comes as
/// arrays, one per column, in batch order: $2 message ids, $3 event ids, $4
/// delivery counts, $5 order ids, $6 items, $7 quantities, $10 the relay's
/// publish sequences (NULL without a relay); $1 is the lease
/// token, $8 the worker, $9 whether the held messages are deleted too (the
/// ack in the effect's transaction).
///
/// The steps are the stepwise path's, in its order: the fence locks the rows
/// the token still holds (by primary key); the held deliveries' events go
/// into the inbox once each, in event order (two batches that share events
/// wait on each other's keys in one order), with the highest delivery count
/// of the batch and its other copies counted as duplicates; events the inbox
/// already held count their copies on their row; each item's projection gets
/// the sum of its new events, in item order, and counts them in its
/// `applied_seq`; each new event gets one ledger row, for its first copy in
/// batch order, numbered within its item (`key_seq`) from the count the
/// projection row had before, in batch order: the row's lock orders the
/// numbers of two batches on one item as their commits.
///
/// Every new event's inbox and ledger rows carry one time, the statement's
/// (`t`): they commit together.
///
/// What it costs the server is kept near what the bench's server-side limit
/// spends on the same steps: one sort of the batch by (event, batch order)
/// serves both the copies' count and the first copy (a window over the whole
/// partition, so the sort the `DISTINCT ON` needs is the window's), and the
/// inbox is probed only for the events the insert found there already
/// (`old`), none in a batch that applies cleanly, instead of once per event
/// of the batch. Together about 6 % more events/s against the statement
/// before (docs/performance.md).
///
/// It returns only what is not the common case, so that a batch that
/// applies cleanly answers with one row, not two per delivery: the messages
/// the lease no longer held (`l`), the held events already in the inbox
/// whose copies it counted (`d`), those it could not count (`o`: an event
/// another transaction committed after this statement's snapshot was taken,
/// which the snapshot cannot see though the insert's conflict does; the
/// caller counts their copies in a statement of its own), and the time (`t`).
/// Every other held event is new.
macro_rules! apply_batch_postgres {
    ($held:literal, $acked:literal) => {
        concat!(
            "WITH b AS (\
     SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bigint[], $10::bigint[]) \
     WITH ORDINALITY AS u(message_id, event_id, attempt, order_id, item_id, qty, publish_seq, ord)), \
     t AS (SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) AS now), ", $held, "hb AS (SELECT b.* FROM b JOIN held USING (message_id)), \
     ev AS (SELECT DISTINCT ON (event_id) hb.*, COUNT(*) OVER w AS copies, MAX(attempt) OVER w AS attempt_max \
     FROM hb WINDOW w AS (PARTITION BY event_id ORDER BY ord ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) \
     ORDER BY event_id, ord), \
     fresh AS (INSERT INTO inbox_processed (event_id, deliveries, duplicates, processed_at_ms) \
     SELECT event_id, attempt_max, copies - 1, (SELECT now FROM t) FROM ev ORDER BY event_id ON CONFLICT (event_id) DO NOTHING RETURNING event_id), \
     old AS (SELECT event_id, copies, attempt_max FROM ev WHERE NOT EXISTS (SELECT 1 FROM fresh f WHERE f.event_id = ev.event_id)), \
     counted AS (UPDATE inbox_processed i SET duplicates = i.duplicates + old.copies, \
     deliveries = GREATEST(i.deliveries, old.attempt_max) FROM old \
     WHERE i.event_id = ANY(ARRAY(SELECT event_id FROM old)) AND i.event_id = old.event_id RETURNING i.event_id), \
     firsts AS (SELECT ev.* FROM ev JOIN fresh f ON f.event_id = ev.event_id), \
     projection AS (INSERT INTO inventory_projection (item_id, reserved_qty, applied_seq) \
     SELECT item_id, SUM(qty), COUNT(*) FROM firsts GROUP BY item_id ORDER BY item_id \
     ON CONFLICT (item_id) DO UPDATE SET reserved_qty = inventory_projection.reserved_qty + excluded.reserved_qty, \
     applied_seq = inventory_projection.applied_seq + excluded.applied_seq RETURNING item_id, applied_seq), \
     ledger AS (INSERT INTO projection_ledger \
     (event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms, key_seq, publish_seq) \
     SELECT f.event_id, f.order_id, f.item_id, f.qty, f.attempt, $8, (SELECT now FROM t), \
     p.applied_seq - COUNT(*) OVER (PARTITION BY f.item_id) + ROW_NUMBER() OVER (PARTITION BY f.item_id ORDER BY f.ord), \
     f.publish_seq FROM firsts f JOIN projection p USING (item_id) ORDER BY f.ord), \
     acked AS (DELETE FROM queue_messages WHERE $9 AND ", $acked, " AND lease_token = $1) \
     SELECT 'l', message_id, CAST(NULL AS BIGINT) FROM b WHERE NOT EXISTS (SELECT 1 FROM held WHERE held.message_id = b.message_id) \
     UNION ALL SELECT 'd', event_id, NULL FROM counted \
     UNION ALL SELECT 'o', event_id, NULL FROM old WHERE NOT EXISTS (SELECT 1 FROM counted WHERE counted.event_id = old.event_id) \
     UNION ALL SELECT 't', '', now FROM t"
        )
    };
}
/// The apply of one lease's batch, fenced by its lease token (`$1`), its
/// rows found by id.
pub const APPLY_BATCH_POSTGRES: &str = apply_batch_postgres!(
    "held AS (SELECT message_id FROM queue_messages WHERE message_id = ANY($2) AND lease_token = $1 FOR UPDATE), ",
    "message_id = ANY($2)"
);
/// [`APPLY_BATCH_POSTGRES`] with the rows found where the lease left them:
/// `$11` their addresses (`ctid`s as text, as the lease returned them). A row
/// that moved since (leased again, retried, parked) is at another address,
/// and a row now at that address carries another token: either way it is
/// not held, as by id. (A row the fence's lock waits for and finds updated
/// is checked again at its new address, which is not in `$11`.)
pub const APPLY_BATCH_AT_POSTGRES: &str = apply_batch_postgres!(
    "held AS (SELECT message_id FROM queue_messages WHERE ctid = ANY(CAST($11 AS tid[])) AND lease_token = $1 FOR UPDATE), ",
    "ctid = ANY(CAST($11 AS tid[]))"
);
/// [`APPLY_BATCH_POSTGRES`] for deliveries a broker made: no fence, every
/// delivery is held (`$1` is NULL and `$9` false: there is no lease in the
/// database and nothing to delete from it).
pub const APPLY_DELIVERIES_POSTGRES: &str = apply_batch_postgres!(
    "held AS (SELECT DISTINCT message_id FROM b WHERE $1::text IS NULL), ",
    "message_id = ANY($2)"
);

/// PostgreSQL only: the ack of a batch, its ids as one array ($2), fenced by
/// the lease token ($1; NULL: any holder, under `no-lease-token`).
pub const ACK_BATCH_POSTGRES: &str =
    "DELETE FROM queue_messages WHERE ($1::text IS NULL OR lease_token = $1) AND message_id = ANY($2)";
/// PostgreSQL only: the ack of a batch found where its lease left it, `$2`
/// the rows' addresses (as [`APPLY_BATCH_AT_POSTGRES`] finds them), fenced
/// by the lease token `$1`.
pub const ACK_BATCH_AT_POSTGRES: &str =
    "DELETE FROM queue_messages WHERE lease_token = $1 AND ctid = ANY(CAST($2 AS tid[]))";

/// PostgreSQL only: moves dead letters back to the queue in one statement, so
/// that exactly the rows deleted are the rows inserted. Two statements (copy,
/// then delete) each read their own snapshot at READ COMMITTED, and a message
/// parked between them was deleted without having been copied (issue 13). A
/// concurrent redrive of the same row waits on the row lock of the DELETE and
/// then finds it gone, so no message is copied twice either. The message comes
/// back visible now, with a fresh delivery count and its last error.
macro_rules! redrive_postgres {
    ($where:literal) => {
        concat!(
            "WITH moved AS (DELETE FROM dead_letters ", $where,
            "RETURNING message_id, event_id, payload, headers, enqueued_at_ms, last_error) ",
            "INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, visible_at_ms, last_error) ",
            "SELECT message_id, event_id, payload, headers, enqueued_at_ms, ",
            "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT), last_error FROM moved"
        )
    };
}
pub const REDRIVE_ALL_POSTGRES: &str = redrive_postgres!("");
/// $1 message.
pub const REDRIVE_ONE_POSTGRES: &str = redrive_postgres!("WHERE message_id = $1 ");

/// SQLite has one writer at a time, so leasing needs no row locks. Its
/// reconcile lock is a write that matches nothing: it takes the database's write
/// lock at once, as `BEGIN IMMEDIATE` would, so the reads that follow cannot be
/// invalidated by a concurrent writer.
pub const SQLITE: Dialect = dialect!(
    "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    ("IN (", ")"),
    "",
    lease_by: ("message_id", "CAST(NULL AS TEXT)"),
    "UPDATE inventory_projection SET reserved_qty = reserved_qty WHERE 1 = 0",
    hold: ("UPDATE queue_messages SET lease_token = lease_token", " RETURNING message_id"),
    json: (ids: "IN (SELECT value FROM json_each($1))", rows: "json_each($1)"),
    // A table's rowid grows with each insert (one past the largest present).
    written: "rowid"
);

// Statements that read the same on both backends.

pub const ORDER_BY_ID: &str = "SELECT order_id, item_id, qty, event_id, correlation_id FROM orders WHERE order_id = $1";
/// `Store::forget_applications`: the applied events it forgets, and how.
pub const FIRST_APPLIED: &str = "SELECT event_id FROM inbox_processed ORDER BY event_id LIMIT $1";
pub const FORGET_INBOX_ENTRY: &str = "DELETE FROM inbox_processed WHERE event_id = $1";
pub const FORGET_LEDGER_LINES: &str = "DELETE FROM projection_ledger WHERE event_id = $1";
pub const UPSERT_PROJECTION: &str = "INSERT INTO inventory_projection (item_id, reserved_qty) VALUES ($1, $2) \
     ON CONFLICT (item_id) DO UPDATE SET reserved_qty = inventory_projection.reserved_qty + excluded.reserved_qty";
pub const SET_PROJECTION: &str = "INSERT INTO inventory_projection (item_id, reserved_qty) VALUES ($1, $2) \
     ON CONFLICT (item_id) DO UPDATE SET reserved_qty = excluded.reserved_qty";
/// The read-modify-write bug mode's count of an item's applications: its
/// projection row is written apart from the count.
pub const COUNT_APPLIED: &str =
    "UPDATE inventory_projection SET applied_seq = applied_seq + $2 WHERE item_id = $1 RETURNING applied_seq";
pub const READ_PROJECTION_ROW: &str = "SELECT reserved_qty FROM inventory_projection WHERE item_id = $1";
/// `(first, rows, columns)` → `($first, $first+1, …), (…)`: VALUES for a
/// multi-row statement, with `extra` appended inside each row.
pub fn values(first: usize, rows: usize, columns: usize, extra: &str) -> String {
    let mut out = String::with_capacity(rows * (columns * 5 + extra.len() + 4));
    for r in 0..rows {
        if r > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for c in 0..columns {
            if c > 0 {
                out.push_str(", ");
            }
            out.push_str(&format!("${}", first + r * columns + c));
        }
        out.push_str(extra);
        out.push(')');
    }
    out
}

/// A delivery the inbox refused: $1 event, $2 the delivery count it came with.
pub const COUNT_DUPLICATE: &str = "UPDATE inbox_processed SET duplicates = duplicates + 1, \
     deliveries = CASE WHEN deliveries < $2 THEN $2 ELSE deliveries END WHERE event_id = $1";
/// The same for a message settled past its last delivery: $1 message.
pub const COUNT_SETTLED_DUPLICATE: &str = "UPDATE inbox_processed SET duplicates = duplicates + 1, \
     deliveries = CASE WHEN deliveries < q.delivery_count THEN q.delivery_count ELSE deliveries END \
     FROM (SELECT event_id, delivery_count FROM queue_messages WHERE message_id = $1) q \
     WHERE inbox_processed.event_id = q.event_id";
pub const DELETE_MESSAGE_HELD: &str =
    "DELETE FROM queue_messages WHERE message_id = $1 AND ($2 IS NULL OR lease_token = $2)";
/// SQLite's redrive, first half: the dead letters deleted and named (SQLite
/// has `DELETE … RETURNING` but no data-modifying CTE); the second half,
/// [`redrive_insert_sqlite`], inserts exactly the rows returned, in the same
/// transaction.
pub const DELETE_DEAD_ALL: &str =
    "DELETE FROM dead_letters RETURNING message_id, event_id, payload, headers, enqueued_at_ms, last_error";
/// $1 message.
pub const DELETE_DEAD_ONE: &str = "DELETE FROM dead_letters WHERE message_id = $1 \
     RETURNING message_id, event_id, payload, headers, enqueued_at_ms, last_error";
/// Columns bound per row of [`redrive_insert_sqlite`].
pub const REDRIVE_COLUMNS: usize = 6;
/// SQLite's redrive, second half: `rows` dead letters back in the queue, each
/// bound as the six columns [`DELETE_DEAD_ALL`] returns, visible now, with a
/// fresh delivery count.
pub fn redrive_insert_sqlite(rows: usize) -> String {
    format!(
        "INSERT INTO queue_messages (message_id, event_id, payload, headers, enqueued_at_ms, last_error, visible_at_ms) \
         VALUES {}",
        values(1, rows, REDRIVE_COLUMNS, &format!(", {}", SQLITE.clock))
    )
}
pub const PROJECTION: &str = "SELECT item_id, reserved_qty FROM inventory_projection ORDER BY item_id";
pub const EXPECTED_PROJECTION: &str = "SELECT o.item_id, CAST(SUM(o.qty) AS BIGINT) FROM orders o \
     JOIN inbox_processed i ON i.event_id = o.event_id GROUP BY o.item_id";
pub const ORPHAN_ORDERS: &str = "SELECT o.order_id, o.item_id, o.qty, o.event_id, o.correlation_id FROM orders o \
     WHERE NOT EXISTS (SELECT 1 FROM inbox_processed i WHERE i.event_id = o.event_id) \
     AND NOT EXISTS (SELECT 1 FROM queue_messages q WHERE q.event_id = o.event_id) \
     AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.event_id = o.event_id) \
     ORDER BY o.created_at_ms";
/// Each order with its event's delivery evidence: from the inbox once the
/// event reached it, else from its message, queued or parked (a message never
/// leased has 0 deliveries); NULL where nothing records it (no inbox under
/// the `no-inbox` bug mode, or an event that is nowhere).
///
/// The queue and the dead letters are grouped by event once and joined, not
/// looked up per order: PostgreSQL's queue has no index on `event_id` (every
/// lease would write one more index entry, see migration 0006), and a
/// lookup per order would read the whole queue once per pending order.
pub const FINAL_ORDERS: &str = "SELECT o.order_id, o.item_id, o.qty, o.event_id, \
     CAST(COALESCE(i.deliveries, q.deliveries, d.deliveries) AS BIGINT), CAST(i.duplicates AS BIGINT) \
     FROM orders o LEFT JOIN inbox_processed i ON i.event_id = o.event_id \
     LEFT JOIN (SELECT event_id, MAX(delivery_count) AS deliveries FROM queue_messages GROUP BY event_id) q \
     ON q.event_id = o.event_id \
     LEFT JOIN (SELECT event_id, MAX(delivery_count) AS deliveries FROM dead_letters GROUP BY event_id) d \
     ON d.event_id = o.event_id \
     ORDER BY o.created_at_ms, o.order_id";
pub const FINAL_LEDGER: &str = "SELECT event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms, \
     key_seq, publish_seq FROM projection_ledger ORDER BY id";
pub const FINAL_PENDING: &str =
    "SELECT message_id, event_id, delivery_count FROM queue_messages ORDER BY enqueued_at_ms, message_id";
pub const FINAL_DEAD: &str =
    "SELECT message_id, event_id, delivery_count, last_error FROM dead_letters ORDER BY dead_at_ms, message_id";
/// 1 when the queue holds a row, 0 when it is empty: the first entry of
/// the `visible_at_ms` index, not the first row of the table. Acks delete
/// from the table's head, so mid-drain a scan of the table reads through
/// every row acked since the last vacuum before it finds a live one (2.7 ms
/// a probe on PostgreSQL in the bench's drains of 50,000 events); the
/// leases' scans of the index mark its dead entries as they pass them.
pub const QUEUE_HAS_ROWS: &str =
    "SELECT CAST(COUNT(*) AS BIGINT) FROM (SELECT 1 FROM queue_messages ORDER BY visible_at_ms LIMIT 1) AS first_row";

pub const ROWS_IN_PIPELINE: &str = "SELECT CAST((SELECT COUNT(*) FROM orders) + (SELECT COUNT(*) FROM queue_messages) \
     + (SELECT COUNT(*) FROM projection_ledger) + (SELECT COUNT(*) FROM dead_letters) \
     + (SELECT COUNT(*) FROM inventory_projection) AS BIGINT)";
