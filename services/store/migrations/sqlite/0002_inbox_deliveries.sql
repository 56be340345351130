-- Delivery evidence: how many times the queue had handed an event's message to
-- a worker when the inbox last saw it, and how many of those deliveries the
-- inbox refused as already processed (the duplicates it absorbed).
ALTER TABLE inbox_processed ADD COLUMN deliveries BIGINT NOT NULL DEFAULT 1;
ALTER TABLE inbox_processed ADD COLUMN duplicates BIGINT NOT NULL DEFAULT 0;
