package hauntadmin

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

const token = "t0ken"

func node(t *testing.T) (*Admin, func(method, path, body, tok string) (int, map[string]any)) {
	t.Helper()
	a := New([]string{"after-effect-before-ack", "after-lease"}, "ack_fail_rate", "clock_offset_ms").WithToken(token)
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	call := func(method, path, body, tok string) (int, map[string]any) {
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewBufferString(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(r.Body).Decode(&out)
		return r.StatusCode, out
	}
	return a, call
}

func TestPointsAreListedBehindTheToken(t *testing.T) {
	_, call := node(t)
	status, body := call("GET", "/admin/points", "", token)
	if status != 200 || len(body["points"].([]any)) != 2 || body["points"].([]any)[0] != "after-effect-before-ack" {
		t.Fatalf("%d %v", status, body)
	}
	for _, tok := range []string{"", "wrong"} {
		if status, _ := call("GET", "/admin/points", "", tok); status != 401 {
			t.Fatalf("token %q: %d", tok, status)
		}
	}
}

func TestWithoutATokenNothingIsServed(t *testing.T) {
	a := New([]string{"p"}).WithToken("")
	if a.Enabled() || a.ListenAndServe("127.0.0.1:0") != nil {
		t.Fatal("served without a token")
	}
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, httptest.NewRequest("GET", "/admin/points", nil))
	if rec.Code != 404 {
		t.Fatal(rec.Code)
	}
}

func TestWorkAtTheArmedPointHoldsAndIsTold(t *testing.T) {
	a, call := node(t)
	held := make(chan time.Duration)
	go func() {
		time.Sleep(200 * time.Millisecond)
		a.Reached("after-lease", map[string]any{"messages": 9}) // not armed there
		start := time.Now()
		a.Reached("after-effect-before-ack", map[string]any{"messages": 3})
		held <- time.Since(start)
	}()
	status, body := call("POST", "/admin/hold", `{"point": "after-effect-before-ack", "wait_ms": 5000, "hold_ms": 400}`, token)
	if status != 200 || body["held"] != true || body["point"] != "after-effect-before-ack" || body["messages"] != 3.0 {
		t.Fatalf("%d %v", status, body)
	}
	if d := <-held; d < 350*time.Millisecond {
		t.Fatalf("held only %v", d)
	}
}

func TestAHoldNoWorkMeetsAnswersFalseAndDisarms(t *testing.T) {
	a, call := node(t)
	status, body := call("POST", "/admin/hold", `{"point": "after-lease", "wait_ms": 50, "hold_ms": 30000}`, token)
	if status != 200 || body["held"] != false {
		t.Fatalf("%d %v", status, body)
	}
	start := time.Now()
	a.Reached("after-lease", nil)
	if time.Since(start) > 100*time.Millisecond {
		t.Fatal("a disarmed point still held")
	}
}

func TestBadHoldsNameTheirField(t *testing.T) {
	_, call := node(t)
	for _, c := range []struct{ body, field string }{
		{`{"point": "after-lunch", "wait_ms": 10, "hold_ms": 10}`, "point"},
		{`{"wait_ms": 10, "hold_ms": 10}`, "point"},
		{`{"point": "after-lease", "wait_ms": 0, "hold_ms": 10}`, "wait_ms"},
		{`{"point": "after-lease", "wait_ms": 10, "hold_ms": 30001}`, "hold_ms"},
		{`{"point": "after-lease", "wait_ms": 10}`, "hold_ms"},
		{`{"point": "after-lease", "wait_ms": "soon", "hold_ms": 10}`, "wait_ms"},
		{`{"point": "after-lease", "wait_ms": 10, "hold_ms": 10, "kill": true}`, "kill"},
		{`{not json`, ""},
		{`[1, 2]`, ""},
	} {
		status, body := call("POST", "/admin/hold", c.body, token)
		field, _ := body["field"].(string)
		if status != 422 || field != c.field || body["error"] == "" {
			t.Fatalf("%s: %d %v", c.body, status, body)
		}
	}
}

func TestSwitchesAreSetAllOrNothing(t *testing.T) {
	a, call := node(t)
	if status, body := call("POST", "/admin/faults", `{"ack_fail_rate": 1, "clock_offset_ms": -5000}`, token); status != 200 ||
		body["ack_fail_rate"] != 1.0 || body["clock_offset_ms"] != -5000.0 {
		t.Fatalf("%d %v", status, body)
	}
	if !a.DropAck() {
		t.Fatal("a rate of 1 drops every ack")
	}
	if skew := time.Since(a.Now()); skew < 4900*time.Millisecond || skew > 5100*time.Millisecond {
		t.Fatalf("skewed by %v", skew)
	}
	for _, c := range []struct{ body, field string }{
		{`{"ack_fail_rate": 0.5, "clock_offset_ms": "later"}`, "clock_offset_ms"},
		{`{"ack_fail_rate": 1.5}`, "ack_fail_rate"},
		{`{"ack_fail_rate": true}`, "ack_fail_rate"},
		{`{"db_error_rate": 0.1}`, "db_error_rate"},
	} {
		if status, body := call("POST", "/admin/faults", c.body, token); status != 422 || body["field"] != c.field {
			t.Fatalf("%s: %d %v", c.body, status, body)
		}
	}
	if _, body := call("GET", "/admin/faults", "", token); body["ack_fail_rate"] != 1.0 || body["clock_offset_ms"] != -5000.0 {
		t.Fatalf("a refused body changed something: %v", body)
	}
}

func TestAnUnknownRouteIs404(t *testing.T) {
	_, call := node(t)
	if status, _ := call("GET", "/admin/nothing", "", token); status != 404 {
		t.Fatal(status)
	}
}
