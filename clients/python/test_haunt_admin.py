"""Tests of haunt_admin over real HTTP on the loopback: python3 -m unittest test_haunt_admin"""

import json
import threading
import time
import unittest
import urllib.error
import urllib.request

from haunt_admin import Admin

TOKEN = "t0ken"


class Node:
    """An Admin served on a free port, and a client for it."""

    def __init__(self, **kwargs):
        self.admin = Admin(token=TOKEN, **kwargs)
        self.server = self.admin.serve("127.0.0.1", 0)
        self.base = "http://127.0.0.1:%d" % self.server.server_address[1]

    def call(self, method, path, body=None, token=TOKEN):
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if token:
            req.add_header("Authorization", "Bearer " + token)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class AdminTest(unittest.TestCase):
    def setUp(self):
        self.node = Node(points=["after-effect-before-ack", "after-lease"], switches=["ack_fail_rate", "clock_offset_ms"])

    def tearDown(self):
        self.node.close()

    def test_points_are_listed(self):
        self.assertEqual(self.node.call("GET", "/admin/points"), (200, {"points": ["after-effect-before-ack", "after-lease"]}))

    def test_a_request_without_the_token_is_refused(self):
        self.assertEqual(self.node.call("GET", "/admin/points", token=None)[0], 401)
        self.assertEqual(self.node.call("GET", "/admin/points", token="wrong")[0], 401)

    def test_without_a_token_nothing_is_served(self):
        quiet = Admin(points=["p"], token="")
        self.assertFalse(quiet.enabled)
        self.assertIsNone(quiet.serve("127.0.0.1", 0))
        self.assertIsNone(quiet.handle("GET", "/admin/points", {}, b""))

    def test_work_at_the_armed_point_holds_and_is_told(self):
        reached = []

        def work():
            time.sleep(0.2)
            self.node.admin.reached("after-lease", messages=9)  # not armed there: goes through
            started = time.monotonic()
            self.node.admin.reached("after-effect-before-ack", messages=3)
            reached.append(time.monotonic() - started)

        t = threading.Thread(target=work)
        t.start()
        status, answer = self.node.call(
            "POST", "/admin/hold", {"point": "after-effect-before-ack", "wait_ms": 5000, "hold_ms": 400})
        t.join()
        self.assertEqual((status, answer), (200, {"held": True, "point": "after-effect-before-ack", "messages": 3}))
        self.assertGreaterEqual(reached[0], 0.35, "the work held still for hold_ms")

    def test_a_hold_no_work_meets_answers_false_and_disarms(self):
        self.assertEqual(self.node.call("POST", "/admin/hold", {"point": "after-lease", "wait_ms": 50, "hold_ms": 30000}),
                         (200, {"held": False}))
        started = time.monotonic()
        self.node.admin.reached("after-lease")
        self.assertLess(time.monotonic() - started, 0.1, "disarmed: later work goes through")

    def test_bad_holds_name_their_field(self):
        for body, field in [
            ({"point": "after-lunch", "wait_ms": 10, "hold_ms": 10}, "point"),
            ({"wait_ms": 10, "hold_ms": 10}, "point"),  # two points: which?
            ({"point": "after-lease", "wait_ms": 0, "hold_ms": 10}, "wait_ms"),
            ({"point": "after-lease", "wait_ms": 10, "hold_ms": 30001}, "hold_ms"),
            ({"point": "after-lease", "wait_ms": 10}, "hold_ms"),
            ({"point": "after-lease", "wait_ms": "soon", "hold_ms": 10}, "wait_ms"),
            ({"point": "after-lease", "wait_ms": 10, "hold_ms": 10, "kill": True}, "kill"),
            (b"{not json", None),
            ([1, 2], None),
        ]:
            status, answer = self.node.call("POST", "/admin/hold", body)
            self.assertEqual(status, 422, body)
            self.assertEqual(answer["field"], field, (body, answer))
            self.assertTrue(answer["error"], answer)

    def test_switches_are_set_all_or_nothing(self):
        self.assertEqual(self.node.call("GET", "/admin/faults"), (200, {"ack_fail_rate": 0.0, "clock_offset_ms": 0}))
        status, answer = self.node.call("POST", "/admin/faults", {"ack_fail_rate": 1, "clock_offset_ms": -5})
        self.assertEqual((status, answer), (200, {"ack_fail_rate": 1.0, "clock_offset_ms": -5}))
        self.assertTrue(self.node.admin.drop_ack())
        self.assertLess(abs(self.node.admin.now_ms() + 5 - time.time() * 1000), 50)
        for body, field in [
            ({"ack_fail_rate": 0.5, "clock_offset_ms": "later"}, "clock_offset_ms"),
            ({"ack_fail_rate": 1.5}, "ack_fail_rate"),
            ({"ack_fail_rate": True}, "ack_fail_rate"),
            ({"db_error_rate": 0.1}, "db_error_rate"),  # a switch this node does not offer
        ]:
            status, answer = self.node.call("POST", "/admin/faults", body)
            self.assertEqual((status, answer["field"]), (422, field), (body, answer))
        self.assertEqual(self.node.call("GET", "/admin/faults")[1], {"ack_fail_rate": 1.0, "clock_offset_ms": -5},
                         "a refused body changes nothing")
        self.node.call("POST", "/admin/faults", {"ack_fail_rate": 0})
        self.assertFalse(any(self.node.admin.drop_ack() for _ in range(1000)))

    def test_an_unknown_route_is_404(self):
        self.assertEqual(self.node.call("GET", "/admin/nothing")[0], 404)


if __name__ == "__main__":
    unittest.main()
