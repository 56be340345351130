-- The reference pipeline's tables. Times are milliseconds since the Unix epoch,
-- read from the database clock, so that no worker's clock decides a lease.

-- The source of truth. order_id is the client's idempotency key.
CREATE TABLE orders (
    order_id       TEXT PRIMARY KEY,
    item_id        TEXT NOT NULL,
    qty            BIGINT NOT NULL,
    event_id       TEXT NOT NULL UNIQUE,
    correlation_id TEXT NOT NULL,
    created_at_ms  BIGINT NOT NULL
);

-- The queue. A message is visible when visible_at_ms <= now; leasing pushes
-- visible_at_ms to the end of the lease and stamps a fresh lease_token, which an
-- ack or a retry must present.
CREATE TABLE queue_messages (
    message_id     TEXT PRIMARY KEY,
    event_id       TEXT NOT NULL,
    payload        TEXT NOT NULL,
    headers        TEXT NOT NULL,
    enqueued_at_ms BIGINT NOT NULL,
    visible_at_ms  BIGINT NOT NULL,
    lease_until_ms BIGINT,
    lease_token    TEXT,
    delivery_count BIGINT NOT NULL DEFAULT 0,
    last_error     TEXT
);
CREATE INDEX queue_messages_visible ON queue_messages (visible_at_ms);
CREATE INDEX queue_messages_event ON queue_messages (event_id);

-- One row per event ever applied: the consumer's idempotency record.
CREATE TABLE inbox_processed (
    event_id        TEXT PRIMARY KEY,
    processed_at_ms BIGINT NOT NULL
);

-- The read model, rebuilt by reconcile from orders.
CREATE TABLE inventory_projection (
    item_id      TEXT PRIMARY KEY,
    reserved_qty BIGINT NOT NULL
);

-- Append-only: one row per application of an event to the projection. A correct
-- consumer writes exactly one per event; the checker counts them.
CREATE TABLE projection_ledger (
    id               BIGSERIAL PRIMARY KEY,
    event_id         TEXT NOT NULL,
    order_id         TEXT NOT NULL,
    item_id          TEXT NOT NULL,
    qty              BIGINT NOT NULL,
    delivery_attempt BIGINT NOT NULL,
    worker_id        TEXT NOT NULL,
    applied_at_ms    BIGINT NOT NULL
);

CREATE TABLE dead_letters (
    message_id     TEXT PRIMARY KEY,
    event_id       TEXT NOT NULL,
    payload        TEXT NOT NULL,
    headers        TEXT NOT NULL,
    enqueued_at_ms BIGINT NOT NULL,
    delivery_count BIGINT NOT NULL,
    last_error     TEXT,
    dead_at_ms     BIGINT NOT NULL
);
CREATE INDEX dead_letters_event ON dead_letters (event_id);
