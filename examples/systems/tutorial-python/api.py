#!/usr/bin/env python3
"""The shop's order API: records an order (the source of truth) and its outbox message.

    POST /orders  {"order_id": str, "item_id": str, "qty": int}
        201 {"order_id", "event_id"}   the order was committed by this request
        200 {"order_id", "event_id"}   the order_id was already there, same item and qty
        400 {"error", "field"}         the body or one of its fields is bad; nothing written
        409 {"error", "field"}         the order_id exists with another item_id or qty
        503 {"error"}                  the database was busy or locked
    GET /healthz  200

--variant naive (and dual-write) writes the order and then, separately, its
message: a crash between the two writes leaves an order that no worker will
ever see. Every other variant writes both in one transaction.

Standard library only.
"""

import argparse
import json
import signal
import sqlite3
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import shopdb
from shopdb import haunt_admin

# Where haunt may hold an order still for a kill (docs/admin.md of haunt):
# the order is written and its message is not. In the naive variant the order
# is committed there; in the fixed one both are still in one transaction.
POINT = "after-order-before-message"

MAX_BODY = 64 * 1024
MAX_ID_LEN = 200
MAX_QTY = 1_000_000


class BadRequest(Exception):
    def __init__(self, field, error):
        super().__init__(error)
        self.field = field
        self.error = error


def parse_order(raw):
    """The order in a request body, or BadRequest naming the first bad field."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise BadRequest("body", f"not JSON: {err}")
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    for field in ("order_id", "item_id"):
        value = body.get(field)
        if not isinstance(value, str) or not value.strip():
            raise BadRequest(field, f"{field} must be a non-empty string")
        if len(value) > MAX_ID_LEN:
            raise BadRequest(field, f"{field} is longer than {MAX_ID_LEN} characters")
    qty = body.get("qty")
    # bool is a subclass of int in Python: true is not a quantity.
    if isinstance(qty, bool) or not isinstance(qty, int):
        raise BadRequest("qty", "qty must be an integer")
    if not 1 <= qty <= MAX_QTY:
        raise BadRequest("qty", f"qty must be between 1 and {MAX_QTY}")
    return body["order_id"], body["item_id"], qty


class Shop:
    """The two ways of placing an order. Each thread has its own connection."""

    def __init__(self, db, variant, busy_timeout_ms, publish_delay_ms, admin):
        self.admin = admin
        self.db = db
        self.variant = variant
        self.busy_timeout_ms = busy_timeout_ms
        self.publish_delay_ms = publish_delay_ms
        self.local = threading.local()

    def conn(self):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = shopdb.connect(self.db, self.busy_timeout_ms)
            self.local.conn = conn
        return conn

    @staticmethod
    def existing(conn, order_id, item_id, qty):
        """(status, body) for an order_id already in the table, or None."""
        row = conn.execute(
            "SELECT item_id, qty, event_id FROM orders WHERE order_id = ?", (order_id,)
        ).fetchone()
        if row is None:
            return None
        if (row[0], row[1]) != (item_id, qty):
            return 409, {"error": f"order {order_id} exists with item_id {row[0]} and qty {row[1]}",
                         "field": "order_id"}
        return 200, {"order_id": order_id, "event_id": row[2]}

    @staticmethod
    def message(order_id, item_id, qty, event_id):
        payload = json.dumps({"order_id": order_id, "item_id": item_id, "qty": qty, "event_id": event_id})
        return (str(uuid.uuid4()), event_id, payload, shopdb.now_ms(), shopdb.now_ms())

    def injected_error(self):
        """The db-error hook: the next statement fails as a busy database would."""
        if self.admin.db_error():
            raise sqlite3.OperationalError("database is locked (injected by haunt's db-error)")

    def place(self, order_id, item_id, qty):
        if "dual-write" in shopdb.MISTAKES[self.variant]:
            return self.place_naive(order_id, item_id, qty)
        return self.place_fixed(order_id, item_id, qty)

    def place_naive(self, order_id, item_id, qty):
        # The tutorial's first version: two writes, each its own autocommit.
        conn = self.conn()
        seen = self.existing(conn, order_id, item_id, qty)
        if seen:
            return seen
        event_id = str(uuid.uuid4())
        try:
            conn.execute(
                "INSERT INTO orders(order_id, item_id, qty, event_id, created_at_ms) VALUES (?, ?, ?, ?, ?)",
                (order_id, item_id, qty, event_id, shopdb.now_ms()))
        except sqlite3.IntegrityError:
            # Another request with the same order_id committed first.
            return self.existing(conn, order_id, item_id, qty) or (500, {"error": "order vanished"})
        # The order is committed now. Its message is not: a SIGKILL here, or a
        # busy database on the next statement, and no worker ever hears of it.
        # A retry of the same order_id then finds the order and answers 200.
        if self.publish_delay_ms > 0:
            time.sleep(self.publish_delay_ms / 1000.0)
        self.admin.reached(POINT, order_id=order_id)
        self.injected_error()
        conn.execute(
            "INSERT INTO queue(message_id, event_id, payload, visible_at_ms, enqueued_at_ms)"
            " VALUES (?, ?, ?, ?, ?)", self.message(order_id, item_id, qty, event_id))
        return 201, {"order_id": order_id, "event_id": event_id}

    def place_fixed(self, order_id, item_id, qty):
        # The transactional outbox: the order and its message commit together or not at all.
        conn = self.conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            seen = self.existing(conn, order_id, item_id, qty)
            if seen:
                conn.execute("ROLLBACK")
                return seen
            event_id = str(uuid.uuid4())
            conn.execute(
                "INSERT INTO orders(order_id, item_id, qty, event_id, created_at_ms) VALUES (?, ?, ?, ?, ?)",
                (order_id, item_id, qty, event_id, shopdb.now_ms()))
            self.admin.reached(POINT, order_id=order_id)
            self.injected_error()
            conn.execute(
                "INSERT INTO queue(message_id, event_id, payload, visible_at_ms, enqueued_at_ms)"
                " VALUES (?, ?, ?, ?, ?)", self.message(order_id, item_id, qty, event_id))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return 201, {"order_id": order_id, "event_id": event_id}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tutorial-shop"
    timeout = 30  # a client that stops sending does not hold a thread forever

    def log_message(self, fmt, *args):
        pass  # answers worth telling are logged in reply()

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if status >= 300:
            corr = self.headers.get("x-correlation-id", "-")
            shopdb.log("api", f"{self.command} {self.path} -> {status} {body} corr={corr}")

    def admin(self, body=b""):
        """True if this was an admin request (docs/admin.md of haunt), answered."""
        headers = {k.lower(): v for k, v in self.headers.items()}
        answer = self.server.shop.admin.handle(self.command, self.path, headers, body)
        if answer is None:
            return False
        self.reply(*answer)
        return True

    def do_GET(self):
        if self.admin():
            return
        if self.path.split("?")[0] == "/healthz":
            self.reply(200, {"status": "ok", "variant": self.server.shop.variant})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        if self.path.startswith("/admin/"):
            length = int(self.headers.get("content-length") or 0)
            if self.admin(self.rfile.read(length) if length > 0 else b""):
                return
        if self.path.split("?")[0] != "/orders":
            self.reply(404, {"error": "not found"})
            return
        try:
            length = int(self.headers.get("content-length", "-1"))
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self.reply(411, {"error": "content-length required", "field": "body"})
            return
        if length > MAX_BODY:
            self.close_connection = True
            self.reply(413, {"error": f"body larger than {MAX_BODY} bytes", "field": "body"})
            return
        raw = self.rfile.read(length)
        try:
            order_id, item_id, qty = parse_order(raw)
        except BadRequest as bad:
            self.reply(400, {"error": bad.error, "field": bad.field})
            return
        try:
            status, body = self.server.shop.place(order_id, item_id, qty)
        except sqlite3.OperationalError as err:
            if shopdb.is_busy(err):
                self.reply(503, {"error": f"database busy: {err}"})
            else:
                self.reply(500, {"error": f"database error: {err}"})
            return
        except Exception as err:  # noqa: BLE001 - an answer is better than a dropped connection
            self.reply(500, {"error": f"{type(err).__name__}: {err}"})
            return
        self.reply(status, body)


def parse_listen(text):
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv=None):
    ap = argparse.ArgumentParser(description="The tutorial shop's order API.")
    ap.add_argument("--listen", type=parse_listen, required=True, metavar="HOST:PORT")
    ap.add_argument("--db", required=True, metavar="PATH", help="SQLite file (created if missing)")
    ap.add_argument("--variant", choices=shopdb.VARIANTS, required=True)
    ap.add_argument("--busy-timeout-ms", type=int, default=2000,
                    help="how long a statement waits for a lock before the API answers 503 (default 2000)")
    ap.add_argument("--publish-delay-ms", type=int, default=0,
                    help="naive only: sleep between committing the order and inserting its message, "
                         "to widen the dual-write crash window (default 0)")
    args = ap.parse_args(argv)

    shopdb.init(args.db, args.variant, args.busy_timeout_ms, "api").close()
    server = ThreadingHTTPServer(args.listen, Handler)
    server.daemon_threads = True
    # Served on --listen beside /orders, only when haunt hands a token.
    admin = haunt_admin.Admin(points=[POINT], switches=["db_error_rate"])
    server.shop = Shop(args.db, args.variant, args.busy_timeout_ms, args.publish_delay_ms, admin)

    def stop(signum, _frame):
        shopdb.log("api", f"signal {signum}: shutting down")
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    shopdb.log("api", f"variant={args.variant} listening on {host}:{port} db={args.db}")
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
