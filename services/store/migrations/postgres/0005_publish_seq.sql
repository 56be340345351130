-- Order evidence: when the relay published the message each application came
-- from (the envelope's headers carry it), so that an inversion can be told
-- to be the relay's (published out of order) or not. NULL without a relay and
-- on rows from before this.
ALTER TABLE projection_ledger ADD COLUMN publish_seq BIGINT;
