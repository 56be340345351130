"""haunt's admin protocol for a Python service: hold points and fault hooks.

haunt (a chaos harness for at-least-once pipelines) strikes a node hardest
when it knows the node is in the middle of its work. A service that uses this
module names the moments where a crash costs the most (its hold points) and
lets haunt switch a few faults on inside it (its hooks). The protocol is
docs/admin.md of haunt's repository; this module is one answer to it, with
the standard library only.

    from haunt_admin import Admin

    admin = Admin(points=["after-effect-before-ack"], switches=["ack_fail_rate"])
    admin.serve("127.0.0.1", 9101)        # or admin.handle(...) in your own server
    ...
    apply(message)
    admin.reached("after-effect-before-ack", messages=1)
    if not admin.drop_ack():
        ack(message)

Nothing is served and every call is a no-op unless HAUNT_ADMIN_TOKEN is set:
haunt sets it for each node that declares `admin` in its system file.
"""

import json
import os
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_VAR = "HAUNT_ADMIN_TOKEN"
HOLD_MS_MAX = 30_000

# The switches a node may offer, each with its check: (field, kind, low, high).
SWITCHES = {
    "ack_fail_rate": (float, 0.0, 1.0),
    "db_error_rate": (float, 0.0, 1.0),
    "clock_offset_ms": (int, None, None),
}


class Refused(Exception):
    """A bad request: answered 422 with the field it was wrong about."""

    def __init__(self, field, error):
        super().__init__(error)
        self.field = field
        self.error = error


class _Arm:
    def __init__(self, point, hold_s):
        self.point = point
        self.hold_s = hold_s
        self.answer = None
        self.reached = threading.Event()


class Admin:
    """One node's side of the protocol: its points, its switches, its token."""

    def __init__(self, points=(), switches=(), token=None):
        unknown = [s for s in switches if s not in SWITCHES]
        if unknown:
            raise ValueError(f"unknown switches {unknown}; known: {sorted(SWITCHES)}")
        self.token = token if token is not None else os.environ.get(TOKEN_VAR)
        self.points = list(points)
        self.switches = {name: SWITCHES[name][0](0) for name in switches}
        self._lock = threading.Lock()
        self._arm = None

    @property
    def enabled(self):
        return bool(self.token)

    # ---- what the service calls ------------------------------------------

    def reached(self, point, **info):
        """At hold point `point`: if haunt armed it, say so and hold still.

        Costs one attribute read when nothing is armed. `info` goes into the
        answer haunt records (say, messages=3).
        """
        if self._arm is None:
            return
        with self._lock:
            arm = self._arm
            if arm is None or arm.point != point:
                return
            self._arm = None
            arm.answer = {"held": True, "point": point, **info}
            arm.reached.set()
        time.sleep(arm.hold_s)

    def drop_ack(self):
        """Whether to drop this ack (the `ack-loss` hook)."""
        rate = self.switches.get("ack_fail_rate", 0.0)
        return rate > 0 and random.random() < rate

    def db_error(self):
        """Whether this database statement should fail (the `db-error` hook)."""
        rate = self.switches.get("db_error_rate", 0.0)
        return rate > 0 and random.random() < rate

    def now_ms(self):
        """This node's clock in ms since the epoch, skewed by the `clock-skew` hook."""
        return int(time.time() * 1000) + self.switches.get("clock_offset_ms", 0)

    # ---- the protocol ------------------------------------------------------

    def hold(self, body):
        """POST /admin/hold: wait for work at a point, then answer."""
        body = _object(body, {"point", "wait_ms", "hold_ms"})
        point = body.get("point")
        if point is None and len(self.points) == 1:
            point = self.points[0]
        if point is None:
            raise Refused("point", f"point is missing (points: {', '.join(self.points) or 'none'})")
        if point not in self.points:
            raise Refused("point", f"no hold point {point!r} here (points: {', '.join(self.points) or 'none'})")
        wait_ms, hold_ms = (_whole(body, f, 1, HOLD_MS_MAX) for f in ("wait_ms", "hold_ms"))
        arm = _Arm(point, hold_ms / 1000.0)
        with self._lock:
            self._arm = arm  # a second request replaces the first
        arm.reached.wait(wait_ms / 1000.0)
        with self._lock:
            if arm.answer is not None:
                return arm.answer
            if self._arm is arm:
                self._arm = None
        return {"held": False}

    def set_faults(self, body):
        """POST /admin/faults: all the fields given, or none if one is bad."""
        body = _object(body, set(self.switches))
        new = dict(self.switches)
        for field, value in body.items():
            kind, low, high = SWITCHES[field]
            if kind is int:
                new[field] = _whole(body, field, low, high)
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise Refused(field, f"{field} must be a number")
                if not low <= value <= high:
                    raise Refused(field, f"{field} must be within {low}..={high}, got {value}")
                new[field] = float(value)
        self.switches = new
        return dict(new)

    def handle(self, method, path, headers, body):
        """Answers an admin request: (status, JSON object), or None for a path
        that is not the protocol's (or any path when no token is set)."""
        path = path.split("?")[0]
        if not self.enabled or not path.startswith("/admin/"):
            return None
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, {"error": "a bearer token is required", "field": None}
        try:
            if (method, path) == ("GET", "/admin/points"):
                return 200, {"points": self.points}
            if (method, path) == ("GET", "/admin/faults"):
                return 200, dict(self.switches)
            if (method, path) == ("POST", "/admin/faults"):
                return 200, self.set_faults(_json(body))
            if (method, path) == ("POST", "/admin/hold"):
                return 200, self.hold(_json(body))
        except Refused as bad:
            return 422, {"error": bad.error, "field": bad.field}
        return 404, {"error": f"no route {method} {path}", "field": None}

    def serve(self, host, port):
        """Serves the protocol on host:port from a daemon thread; None when no
        token is set. Returns the server (its server_address has the port)."""
        if not self.enabled:
            return None
        admin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def answer(self):
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length > 0 else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, obj = admin.handle(self.command, self.path, headers, body) or (404, {"error": "not found"})
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = answer

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="haunt-admin").start()
        return server


def _json(raw):
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise Refused(None, f"the body is not JSON: {err}")


def _object(body, allowed):
    if not isinstance(body, dict):
        raise Refused(None, "the body must be a JSON object")
    for field in body:
        if field not in allowed:
            raise Refused(field, f"unknown field {field!r} (known: {', '.join(sorted(allowed)) or 'none'})")
    return body


def _whole(body, field, low, high):
    value = body.get(field)
    if value is None:
        raise Refused(field, f"{field} is missing")
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused(field, f"{field} must be an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        raise Refused(field, f"{field} must be within {low}..={high}, got {value}")
    return value
