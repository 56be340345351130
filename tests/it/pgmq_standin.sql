-- A stand-in for pgmq's SQL-only install, for the suite only: the five calls
-- `haunt bench pipeline --pgmq-sql` makes, with pgmq's names, signatures and
-- queue table (pgmq.q_NAME), written here so that the suite can run the
-- bench's pgmq phase without pgmq's own file, which is not haunt's to ship.
-- A measurement uses pgmq's file (docs/performance.md says where it is).
CREATE SCHEMA pgmq;

CREATE FUNCTION pgmq.create(queue_name TEXT) RETURNS void AS $$
BEGIN
  EXECUTE format('CREATE TABLE pgmq.%I (msg_id BIGSERIAL PRIMARY KEY, read_ct INTEGER NOT NULL DEFAULT 0, '
    'enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(), vt TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(), '
    'message JSONB)', 'q_' || queue_name);
END;
$$ LANGUAGE plpgsql;

CREATE FUNCTION pgmq.drop_queue(queue_name TEXT) RETURNS BOOLEAN AS $$
BEGIN
  EXECUTE format('DROP TABLE pgmq.%I', 'q_' || queue_name);
  RETURN true;
END;
$$ LANGUAGE plpgsql;

CREATE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[]) RETURNS SETOF BIGINT AS $$
BEGIN
  RETURN QUERY EXECUTE format('INSERT INTO pgmq.%I (message) SELECT unnest($1) RETURNING msg_id', 'q_' || queue_name)
    USING msgs;
END;
$$ LANGUAGE plpgsql;

CREATE TYPE pgmq.message_record AS (msg_id BIGINT, read_ct INTEGER, enqueued_at TIMESTAMPTZ, vt TIMESTAMPTZ,
  message JSONB);

CREATE FUNCTION pgmq.read(queue_name TEXT, vt INTEGER, qty INTEGER) RETURNS SETOF pgmq.message_record AS $$
BEGIN
  RETURN QUERY EXECUTE format(
    'UPDATE pgmq.%1$I m SET vt = clock_timestamp() + make_interval(secs => $2), read_ct = m.read_ct + 1 '
    'FROM (SELECT q.msg_id FROM pgmq.%1$I q WHERE q.vt <= clock_timestamp() ORDER BY q.msg_id LIMIT $1 '
    'FOR UPDATE SKIP LOCKED) c WHERE m.msg_id = c.msg_id '
    'RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message', 'q_' || queue_name)
    USING qty, vt;
END;
$$ LANGUAGE plpgsql;

CREATE FUNCTION pgmq.delete(queue_name TEXT, msg_ids BIGINT[]) RETURNS SETOF BIGINT AS $$
BEGIN
  RETURN QUERY EXECUTE format('DELETE FROM pgmq.%I WHERE msg_id = ANY($1) RETURNING msg_id', 'q_' || queue_name)
    USING msg_ids;
END;
$$ LANGUAGE plpgsql;
