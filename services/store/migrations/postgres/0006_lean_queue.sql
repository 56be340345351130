-- The queue's rows are written three times each (enqueued, leased, acked),
-- and what a write costs is mostly the WAL it makes. Two things made it
-- more than it needed to be:
--
-- - An index on event_id that no delivery reads: every enqueue and every
--   lease (an update of an indexed column, so never a HOT update) wrote an
--   entry in it. The statements that look a queued message up by event
--   (the final state, reconcile's orphans) join the queue grouped by event
--   instead.
-- - A full table: a lease writes the new version of its row wherever there
--   is room, which on full pages is another page, and then the whole new
--   row goes into the WAL. With room on the page for one new version of
--   each row, the lease's new version lands beside the old one, and
--   PostgreSQL logs only the bytes that changed (the lease's columns, not
--   the payload and headers before them).
--
-- docs/performance.md measures both (the queue's WAL per event).
DROP INDEX IF EXISTS queue_messages_event;
ALTER TABLE queue_messages SET (fillfactor = 50);
