#!/usr/bin/env python3
"""The shop's worker: leases a message from the queue table, reserves inventory, acks.

A lease makes a message invisible for --visibility-timeout-ms; a worker that
dies or stalls without acking lets it be delivered again when the lease runs
out. That is at-least-once delivery: redeliveries are normal, and only the
consumer can keep them from being applied twice.

--variant naive   the tutorial's first version (see README.md for what breaks):
                  the lease is taken with a SELECT and a separate UPDATE on the
                  worker's own clock, with no token; the reservation is a
                  read-modify-write over two autocommit statements; there is no
                  inbox; the ack deletes the message by id, whoever holds it now.
--variant fixed   the idempotent consumer: the lease is claimed in one write
                  transaction, on the database's clock, and carries a fencing
                  token; the inbox insert, the atomic upsert of the reservation and a ledger row commit in one
                  transaction that first checks the token; the ack deletes only
                  if the token still matches; a message delivered
                  --max-deliveries times without an ack is dead-lettered, unless
                  its effect is already in (then only its acks were lost).

--variant dual-write, lost-update, unfenced, no-inbox: fixed but for that one
                  mistake (shopdb.MISTAKES; dual-write is the API's).

--ack-fail-rate   the share of acks that are "lost" (simulated: the worker
                  simply does not delete the message), for both variants.

Standard library only. SIGKILL or SIGSTOP at any moment is survivable: every
write is a single statement or one transaction, and a lease that is never
acked expires.
"""

import argparse
import json
import random
import signal
import sqlite3
import sys
import time
import uuid

import shopdb
from shopdb import haunt_admin

# Where haunt may hold a delivery still for a kill (docs/admin.md of haunt):
# its effect is in the projection and its ack is not sent.
POINT = "after-effect-before-ack"

# SQLite's own idea of now, in ms since the epoch.
DB_NOW_MS = "SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"

stopping = False


def on_signal(signum, _frame):
    global stopping
    stopping = True


class Message:
    __slots__ = ("message_id", "event_id", "payload", "delivery", "token")

    def __init__(self, message_id, event_id, payload, delivery, token=None):
        self.message_id = message_id
        self.event_id = event_id
        self.payload = payload
        self.delivery = delivery  # this delivery's number, 1 for the first
        self.token = token


def parse_payload(msg):
    body = json.loads(msg.payload)
    order_id, item_id, qty = body["order_id"], body["item_id"], body["qty"]
    if not isinstance(item_id, str) or isinstance(qty, bool) or not isinstance(qty, int):
        raise ValueError(f"bad payload {msg.payload!r}")
    return order_id, item_id, qty


class Worker:
    def __init__(self, conn, args, admin):
        self.conn = conn
        self.me = args.id
        self.variant = args.variant
        self.mistakes = shopdb.MISTAKES[args.variant]
        self.read_delay_ms = args.read_delay_ms
        self.vt = args.visibility_timeout_ms
        self.ack_fail_rate = args.ack_fail_rate
        self.max_deliveries = args.max_deliveries
        self.admin = admin
        self.stats = {"applied": 0, "duplicates": 0, "acks_lost": 0, "leases_lost": 0, "dead": 0}

    def log(self, text):
        shopdb.log(self.me, text)

    def lost_ack(self, msg):
        # The hold point comes first: the effect is in and the ack not sent.
        self.admin.reached(POINT, event_id=msg.event_id)
        hooked = self.admin.drop_ack()
        if hooked or (self.ack_fail_rate > 0 and random.random() < self.ack_fail_rate):
            self.stats["acks_lost"] += 1
            self.log(f"ack lost ({'haunt ack-loss' if hooked else 'simulated'}) message={msg.message_id} event={msg.event_id}"
                     f" delivery={msg.delivery}")
            return True
        return False

    # ---- naive -------------------------------------------------------------

    def lease_naive(self):
        # Find a visible message, then mark it leased: two statements, so two
        # workers can pick the same message between them. The lease ends on
        # this worker's clock, and nothing says who holds it afterwards.
        t = self.admin.now_ms()
        row = self.conn.execute(
            "SELECT message_id, event_id, payload, delivery_count FROM queue"
            " WHERE visible_at_ms <= ? ORDER BY visible_at_ms LIMIT 1", (t,)).fetchone()
        if row is None:
            return None
        self.conn.execute(
            "UPDATE queue SET visible_at_ms = ?, lease_owner = ?, delivery_count = delivery_count + 1"
            " WHERE message_id = ?", (t + self.vt, self.me, row[0]))
        return Message(row[0], row[1], row[2], row[3] + 1)

    def handle_naive(self, msg):
        order_id, item_id, qty = parse_payload(msg)
        # Read-modify-write of the projection, each statement on its own: a
        # concurrent reservation of the same item between them is overwritten.
        row = self.conn.execute("SELECT reserved_qty FROM inventory WHERE item_id = ?", (item_id,)).fetchone()
        if row is None:
            self.conn.execute("INSERT INTO inventory(item_id, reserved_qty) VALUES (?, ?)", (item_id, qty))
        else:
            self.conn.execute("UPDATE inventory SET reserved_qty = ? WHERE item_id = ?", (row[0] + qty, item_id))
        self.stats["applied"] += 1
        self.log(f"applied event={msg.event_id} order={order_id} item={item_id} qty={qty} delivery={msg.delivery}")
        # No inbox: if this ack is lost, or the worker dies before it, the
        # message comes back and is applied again.
        if self.lost_ack(msg):
            return
        self.conn.execute("DELETE FROM queue WHERE message_id = ?", (msg.message_id,))

    # ---- fixed -------------------------------------------------------------

    def lease_fixed(self):
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            # The database's clock, not this worker's: a worker whose clock
            # jumped (haunt's clock-skew) still leases for the visibility
            # timeout, and sees others' leases as they are.
            t = conn.execute(DB_NOW_MS).fetchone()[0]
            row = conn.execute(
                "SELECT message_id, event_id, payload, delivery_count, last_error FROM queue"
                " WHERE visible_at_ms <= ? ORDER BY visible_at_ms LIMIT 1", (t,)).fetchone()
            if row is None:
                conn.execute("COMMIT")
                return None
            message_id, event_id, payload, count, last_error = row
            if count >= self.max_deliveries:
                done = conn.execute("SELECT 1 FROM inbox WHERE event_id = ?", (event_id,)).fetchone()
                if done:
                    # Its effect is in: only its acks were lost. Dead-lettering it
                    # would hide an applied effect, so just finish it.
                    conn.execute("DELETE FROM queue WHERE message_id = ?", (message_id,))
                    self.log(f"finished applied message={message_id} after {count} deliveries")
                else:
                    self.dead_letter(message_id, event_id, payload, count,
                                     last_error or f"delivered {count} times without an ack")
                conn.execute("COMMIT")
                return "again"
            token = uuid.uuid4().hex
            conn.execute(
                "UPDATE queue SET visible_at_ms = ?, lease_owner = ?, lease_token = ?,"
                " delivery_count = delivery_count + 1 WHERE message_id = ?",
                (t + self.vt, self.me, token, message_id))
            conn.execute("COMMIT")
            return Message(message_id, event_id, payload, count + 1, token)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def dead_letter(self, message_id, event_id, payload, count, reason):
        # Inside the caller's transaction.
        self.conn.execute(
            "INSERT OR REPLACE INTO dlq(message_id, event_id, payload, delivery_count, reason, dead_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?)", (message_id, event_id, payload, count, reason, shopdb.now_ms()))
        self.conn.execute("DELETE FROM queue WHERE message_id = ?", (message_id,))
        self.stats["dead"] += 1
        self.log(f"dead-lettered message={message_id} event={event_id} deliveries={count}: {reason}")

    def holds(self, msg):
        if msg.token is None:
            # An unfenced lease: nothing to compare, so it always "holds".
            return True
        row = self.conn.execute("SELECT lease_token FROM queue WHERE message_id = ?", (msg.message_id,)).fetchone()
        return row is not None and row[0] == msg.token

    def handle_fixed(self, msg):
        conn = self.conn
        try:
            order_id, item_id, qty = parse_payload(msg)
        except (ValueError, KeyError, TypeError) as err:
            # A poison message: no delivery will ever succeed.
            conn.execute("BEGIN IMMEDIATE")
            try:
                if self.holds(msg):
                    self.dead_letter(msg.message_id, msg.event_id, msg.payload, msg.delivery, f"poison: {err}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return
        if "lost-update" in self.mistakes:
            # MISTAKE lost-update: the reservation is read before the
            # transaction and written back inside it, so a reservation that
            # another worker commits in between is overwritten.
            row = conn.execute("SELECT reserved_qty FROM inventory WHERE item_id = ?", (item_id,)).fetchone()
            reserved_before = None if row is None else row[0]
            if self.read_delay_ms > 0:
                time.sleep(self.read_delay_ms / 1000.0)
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not self.holds(msg):
                # Our lease ran out (we were stopped, or slow) and someone else
                # took the message, or already acked it. Theirs to apply.
                conn.execute("ROLLBACK")
                self.stats["leases_lost"] += 1
                self.log(f"lease lost before apply message={msg.message_id} event={msg.event_id}")
                return
            if "no-inbox" in self.mistakes:
                first = True  # MISTAKE no-inbox: every delivery is the first
            else:
                first = conn.execute(
                    "INSERT INTO inbox(event_id, processed_at_ms) VALUES (?, ?) ON CONFLICT(event_id) DO NOTHING",
                    (msg.event_id, shopdb.now_ms())).rowcount == 1
            if first:
                if "lost-update" in self.mistakes:
                    conn.execute(
                        "INSERT INTO inventory(item_id, reserved_qty) VALUES (?, ?)"
                        " ON CONFLICT(item_id) DO UPDATE SET reserved_qty = excluded.reserved_qty",
                        (item_id, (reserved_before or 0) + qty))
                else:
                    conn.execute(
                        "INSERT INTO inventory(item_id, reserved_qty) VALUES (?, ?)"
                        " ON CONFLICT(item_id) DO UPDATE SET reserved_qty = reserved_qty + excluded.reserved_qty",
                        (item_id, qty))
                conn.execute(
                    "INSERT INTO ledger(event_id, order_id, item_id, qty, delivery_attempt, worker_id, applied_at_ms)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (msg.event_id, order_id, item_id, qty, msg.delivery, self.me, shopdb.now_ms()))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if first:
            self.stats["applied"] += 1
            self.log(f"applied event={msg.event_id} order={order_id} item={item_id} qty={qty} delivery={msg.delivery}")
        else:
            self.stats["duplicates"] += 1
            self.log(f"duplicate skipped event={msg.event_id} delivery={msg.delivery}")
        if self.lost_ack(msg):
            return
        if msg.token is None:
            # MISTAKE unfenced: the ack deletes by id, whoever holds the lease now.
            conn.execute("DELETE FROM queue WHERE message_id = ?", (msg.message_id,))
            return
        # Fenced ack: only the current lease holder may delete the message.
        acked = conn.execute("DELETE FROM queue WHERE message_id = ? AND lease_token = ?",
                             (msg.message_id, msg.token)).rowcount
        if not acked:
            self.stats["leases_lost"] += 1
            self.log(f"lease lost before ack message={msg.message_id}; the holder will ack")

    def note_error(self, msg, err):
        """Best effort: remember why a delivery failed, for the dead-letter row."""
        if msg is None or msg.token is None:
            return
        try:
            self.conn.execute("UPDATE queue SET last_error = ? WHERE message_id = ? AND lease_token = ?",
                              (f"{type(err).__name__}: {err}", msg.message_id, msg.token))
        except sqlite3.Error:
            pass

    # ---- loop --------------------------------------------------------------

    def step(self):
        """One lease and its handling. True if there was something to do."""
        if "unfenced" in self.mistakes:
            msg = self.lease_naive()
        else:
            msg = self.lease_fixed()
            if msg == "again":
                return True
        if msg is None:
            return False
        try:
            if self.variant == "naive":
                self.handle_naive(msg)
            else:
                self.handle_fixed(msg)
        except sqlite3.Error as err:
            self.note_error(msg, err)
            raise
        return True

    def run(self, poll_ms):
        backoff = poll_ms
        last_report = time.monotonic()
        while not stopping:
            try:
                busy = self.step()
                backoff = poll_ms
            except sqlite3.Error as err:
                # Busy (a peer holds the write lock, perhaps stopped), or the
                # naive variant's INSERT racing another worker's. The lease
                # will expire and the message come back.
                if self.conn.in_transaction:
                    try:
                        self.conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                self.log(f"error: {type(err).__name__}: {err}; retrying in {backoff} ms")
                time.sleep(backoff / 1000.0)
                backoff = min(backoff * 2, 2000)
                continue
            if not busy:
                time.sleep(poll_ms * (0.5 + random.random()) / 1000.0)
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                self.log(f"stats {self.stats}")
        self.log(f"stopping; stats {self.stats}")


def main(argv=None):
    ap = argparse.ArgumentParser(description="The tutorial shop's worker.")
    ap.add_argument("--db", required=True, metavar="PATH")
    ap.add_argument("--id", required=True, metavar="NAME", help="this worker's name (lease owner, ledger worker_id)")
    ap.add_argument("--variant", choices=shopdb.VARIANTS, required=True)
    ap.add_argument("--visibility-timeout-ms", type=int, default=2000,
                    help="how long a lease hides a message (default 2000)")
    ap.add_argument("--ack-fail-rate", type=float, default=None,
                    help="share of acks lost on purpose, 0..1 (default 0.1 for naive, 0 for fixed)")
    ap.add_argument("--max-deliveries", type=int, default=10,
                    help="fixed only: deliveries without an ack before a message is dead-lettered (default 10)")
    ap.add_argument("--poll-ms", type=int, default=100, help="sleep when the queue is empty (default 100)")
    ap.add_argument("--busy-timeout-ms", type=int, default=2000, help="SQLite busy timeout (default 2000)")
    ap.add_argument("--seed", type=int, default=None, help="seed for the simulated ack losses")
    ap.add_argument("--read-delay-ms", type=int, default=0,
                    help="lost-update only: sleep between reading the reservation and writing it back, as a "
                         "call to another service there would; widens the race (default 0)")
    ap.add_argument("--admin-listen", default=None, metavar="HOST:PORT",
                    help="serve haunt's admin protocol here (hold point and the ack-loss and clock-skew "
                         "hooks); only when HAUNT_ADMIN_TOKEN is set")
    args = ap.parse_args(argv)
    if args.ack_fail_rate is None:
        args.ack_fail_rate = 0.1 if args.variant == "naive" else 0.0
    if not 0.0 <= args.ack_fail_rate <= 1.0:
        ap.error("--ack-fail-rate must be between 0 and 1")
    if args.visibility_timeout_ms <= 0 or args.poll_ms <= 0 or args.max_deliveries <= 0:
        ap.error("--visibility-timeout-ms, --poll-ms and --max-deliveries must be positive")
    if args.seed is not None:
        random.seed(args.seed)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    conn = shopdb.init(args.db, args.variant, args.busy_timeout_ms, args.id)
    shopdb.log(args.id, f"variant={args.variant} vt={args.visibility_timeout_ms}ms"
                        f" ack_fail_rate={args.ack_fail_rate} db={args.db}")
    admin = haunt_admin.Admin(points=[POINT], switches=["ack_fail_rate", "clock_offset_ms"])
    if args.admin_listen and admin.enabled:
        host, _, port = args.admin_listen.rpartition(":")
        admin.serve(host, int(port))
    Worker(conn, args, admin).run(args.poll_ms)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
