"""The shop's database: connection settings and the schema, shared by api.py and worker.py.

Whichever process starts first creates the tables; every statement is
`IF NOT EXISTS`, so starting a second process (or restarting a killed one)
against the same file changes nothing.

Standard library only.
"""

import os
import random
import sqlite3
import sys
import time

# haunt's admin protocol (hold points and fault hooks), from clients/python of
# haunt's repository; installed elsewhere, it is found on the path as it is.
try:
    import haunt_admin
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "clients", "python"))
    import haunt_admin  # noqa: F401 - re-exported for api.py and worker.py

# Tables both variants use. The queue is the outbox *and* the broker: the API
# inserts a message, workers lease it (visible_at_ms moves into the future),
# apply it, and ack it (delete the row).
COMMON_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS orders (
        order_id    TEXT PRIMARY KEY,
        item_id     TEXT NOT NULL,
        qty         INTEGER NOT NULL,
        event_id    TEXT NOT NULL UNIQUE,
        created_at_ms INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS queue (
        message_id     TEXT PRIMARY KEY,
        event_id       TEXT NOT NULL,
        payload        TEXT NOT NULL,
        visible_at_ms  INTEGER NOT NULL,
        lease_owner    TEXT,
        lease_token    TEXT,
        delivery_count INTEGER NOT NULL DEFAULT 0,
        last_error     TEXT,
        enqueued_at_ms INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS queue_visible ON queue(visible_at_ms)",
    """CREATE TABLE IF NOT EXISTS inventory (
        item_id      TEXT PRIMARY KEY,
        reserved_qty INTEGER NOT NULL
    )""",
]

# Tables only the fixed variant keeps.
FIXED_SCHEMA = [
    # The idempotent consumer's memory: one row per event whose effect is in
    # the projection. Its primary key is what turns a redelivery into a no-op.
    """CREATE TABLE IF NOT EXISTS inbox (
        event_id      TEXT PRIMARY KEY,
        processed_at_ms INTEGER NOT NULL
    )""",
    # One row per application of an event to the projection, written in the
    # effect's own transaction: what haunt reads as `applied`.
    """CREATE TABLE IF NOT EXISTS ledger (
        event_id         TEXT NOT NULL,
        order_id         TEXT NOT NULL,
        item_id          TEXT NOT NULL,
        qty              INTEGER NOT NULL,
        delivery_attempt INTEGER NOT NULL,
        worker_id        TEXT NOT NULL,
        applied_at_ms    INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dlq (
        message_id     TEXT PRIMARY KEY,
        event_id       TEXT NOT NULL,
        payload        TEXT NOT NULL,
        delivery_count INTEGER NOT NULL,
        reason         TEXT,
        dead_at_ms     INTEGER NOT NULL
    )""",
]

# Each variant's mistakes. naive makes the tutorial's four at once, fixed none;
# each of the others is fixed but for one of them, so that haunt can be shown
# to catch that one alone (README.md says what each does):
#   dual-write   the order and its message are two writes
#   lost-update  the reservation is read before its transaction and written back
#   unfenced     the lease is a SELECT and an UPDATE on the worker's clock, with
#                no token; the ack deletes by id, whoever holds the lease
#   no-inbox     nothing remembers which events are in: a redelivery applies again
MISTAKES = {
    "naive": frozenset({"dual-write", "lost-update", "unfenced", "no-inbox"}),
    "fixed": frozenset(),
    "dual-write": frozenset({"dual-write"}),
    "lost-update": frozenset({"lost-update"}),
    "unfenced": frozenset({"unfenced"}),
    "no-inbox": frozenset({"no-inbox"}),
}
VARIANTS = tuple(MISTAKES)


def now_ms():
    """Unix time in milliseconds, on this process's own clock."""
    return int(time.time() * 1000)


def log(who, msg):
    print(f"{time.strftime('%H:%M:%S')} {who} {msg}", file=sys.stderr, flush=True)


def is_busy(err):
    """True for SQLite's 'database is locked' / 'database is busy' errors."""
    if not isinstance(err, sqlite3.OperationalError):
        return False
    text = str(err).lower()
    return "locked" in text or "busy" in text


def connect(path, busy_timeout_ms):
    """A connection in autocommit mode (we say BEGIN ourselves), WAL, busy timeout."""
    conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000.0, isolation_level=None,
                           check_same_thread=True)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    return conn


def init(path, variant, busy_timeout_ms, who, attempts=50):
    """Open the database, switch it to WAL and create the schema; bounded retries.

    Several processes may start at once on a fresh file, and a peer may be
    stopped (SIGSTOP) while holding the write lock, so each step retries on
    'locked' a bounded number of times before giving up.
    """
    last = None
    for attempt in range(attempts):
        conn = None
        try:
            conn = connect(path, busy_timeout_ms)
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"journal_mode is {mode}, database is locked?")
            # Every variant but naive keeps the inbox, the ledger and dead letters.
            statements = COMMON_SCHEMA + (FIXED_SCHEMA if variant != "naive" else [])
            conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in statements:
                    conn.execute(stmt)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return conn
        except sqlite3.OperationalError as err:
            last = err
            if conn is not None:
                conn.close()
            log(who, f"schema: {err} (attempt {attempt + 1}/{attempts})")
            time.sleep(0.05 + random.random() * 0.2)
    raise SystemExit(f"{who}: could not open {path}: {last}")
