-- Order evidence: each item's projection row counts the events applied to it,
-- and each ledger row takes its item's next number in the same statement that
-- updates that row, so that an item's applications are numbered in the order
-- they committed. Ledger rows from before this have none.
ALTER TABLE inventory_projection ADD COLUMN applied_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE projection_ledger ADD COLUMN key_seq BIGINT;
