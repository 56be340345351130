-- The order rows were written in, for a relay that keeps each key's order:
-- two rows written in the same millisecond are told apart by it. (SQLite's
-- rowid does the same there.)
ALTER TABLE queue_messages ADD COLUMN seq BIGSERIAL;
