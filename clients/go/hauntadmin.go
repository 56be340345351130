// Package hauntadmin answers haunt's admin protocol for a Go service: hold
// points, where a kill or a pause of the node waits for work in flight, and
// fault hooks, switches that haunt flips inside the node (docs/admin.md of
// haunt's repository). Standard library only.
//
//	admin := hauntadmin.New([]string{"after-effect-before-ack"}, "ack_fail_rate")
//	go admin.ListenAndServe("127.0.0.1:9101")
//	...
//	apply(msg)
//	admin.Reached("after-effect-before-ack", map[string]any{"messages": 1})
//	if !admin.DropAck() {
//		msg.Ack()
//	}
//
// Nothing is served and every call is a no-op unless HAUNT_ADMIN_TOKEN is
// set: haunt sets it for each node that declares `admin` in its system file.
package hauntadmin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// TokenVar names the variable that holds the bearer token.
const TokenVar = "HAUNT_ADMIN_TOKEN"

// HoldMsMax bounds wait_ms and hold_ms.
const HoldMsMax = 30_000

// The switches a node may offer: rates from 0 to 1, or a whole offset.
var rates = map[string]bool{"ack_fail_rate": true, "db_error_rate": true, "clock_offset_ms": false}

type arm struct {
	point   string
	hold    time.Duration
	answer  map[string]any
	reached chan struct{}
}

// Admin is one node's side of the protocol.
type Admin struct {
	token  string
	points []string

	mu       sync.Mutex
	switches map[string]float64
	arm      *arm
}

// New offers points and the named switches (ack_fail_rate, db_error_rate,
// clock_offset_ms), with the token from HAUNT_ADMIN_TOKEN. It panics on an
// unknown switch: that is a mistake in the service, not in a request.
func New(points []string, switches ...string) *Admin {
	a := &Admin{token: os.Getenv(TokenVar), points: slices.Clone(points), switches: map[string]float64{}}
	for _, s := range switches {
		if _, ok := rates[s]; !ok {
			panic(fmt.Sprintf("hauntadmin: unknown switch %q", s))
		}
		a.switches[s] = 0
	}
	return a
}

// WithToken replaces the token (tests; a service takes it from the environment).
func (a *Admin) WithToken(token string) *Admin { a.token = token; return a }

// Enabled says whether a token was handed: without one nothing is served.
func (a *Admin) Enabled() bool { return a.token != "" }

// Reached marks hold point `point`: if haunt armed it, the node says so and
// holds still. info goes into the answer haunt records.
func (a *Admin) Reached(point string, info map[string]any) {
	a.mu.Lock()
	h := a.arm
	if h == nil || h.point != point {
		a.mu.Unlock()
		return
	}
	a.arm = nil
	h.answer = map[string]any{"held": true, "point": point}
	for k, v := range info {
		h.answer[k] = v
	}
	close(h.reached)
	a.mu.Unlock()
	time.Sleep(h.hold)
}

func (a *Admin) chance(name string) bool {
	a.mu.Lock()
	rate := a.switches[name]
	a.mu.Unlock()
	return rate > 0 && rand.Float64() < rate
}

// DropAck says whether to drop this ack (the ack-loss hook).
func (a *Admin) DropAck() bool { return a.chance("ack_fail_rate") }

// DBError says whether this database statement should fail (the db-error hook).
func (a *Admin) DBError() bool { return a.chance("db_error_rate") }

// Now is this node's clock, skewed by the clock-skew hook.
func (a *Admin) Now() time.Time {
	a.mu.Lock()
	offset := a.switches["clock_offset_ms"]
	a.mu.Unlock()
	return time.Now().Add(time.Duration(offset) * time.Millisecond)
}

// refusal is a 422: the field the body was wrong about ("" for none).
type refusal struct{ field, err string }

func refuse(field, format string, args ...any) *refusal {
	return &refusal{field, fmt.Sprintf(format, args...)}
}

// object reads a JSON object whose fields are all in allowed.
func object(body []byte, allowed []string) (map[string]json.Number, map[string]json.RawMessage, *refusal) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		return nil, nil, refuse("", "the body must be a JSON object")
	}
	numbers := map[string]json.Number{}
	for k, v := range raw {
		if !slices.Contains(allowed, k) {
			return nil, nil, refuse(k, "unknown field %q (known: %s)", k, strings.Join(allowed, ", "))
		}
		d := json.NewDecoder(bytes.NewReader(v))
		d.UseNumber()
		var n any
		if d.Decode(&n) == nil {
			if num, ok := n.(json.Number); ok {
				numbers[k] = num
			}
		}
	}
	return numbers, raw, nil
}

func whole(numbers map[string]json.Number, raw map[string]json.RawMessage, field string, low, high int64) (int64, *refusal) {
	if _, present := raw[field]; !present {
		return 0, refuse(field, "%s is missing", field)
	}
	n, ok := numbers[field]
	v, err := n.Int64()
	if !ok || err != nil {
		return 0, refuse(field, "%s must be an integer", field)
	}
	if v < low || v > high {
		return 0, refuse(field, "%s must be within %d..=%d, got %d", field, low, high, v)
	}
	return v, nil
}

func (a *Admin) hold(body []byte) (map[string]any, *refusal) {
	numbers, raw, bad := object(body, []string{"hold_ms", "point", "wait_ms"})
	if bad != nil {
		return nil, bad
	}
	point := ""
	if p, ok := raw["point"]; ok {
		if json.Unmarshal(p, &point) != nil {
			return nil, refuse("point", "point must be a string")
		}
	} else if len(a.points) == 1 {
		point = a.points[0]
	} else {
		return nil, refuse("point", "point is missing (points: %s)", strings.Join(a.points, ", "))
	}
	if !slices.Contains(a.points, point) {
		return nil, refuse("point", "no hold point %q here (points: %s)", point, strings.Join(a.points, ", "))
	}
	wait, bad := whole(numbers, raw, "wait_ms", 1, HoldMsMax)
	if bad != nil {
		return nil, bad
	}
	hold, bad := whole(numbers, raw, "hold_ms", 1, HoldMsMax)
	if bad != nil {
		return nil, bad
	}
	h := &arm{point: point, hold: time.Duration(hold) * time.Millisecond, reached: make(chan struct{})}
	a.mu.Lock()
	a.arm = h // a second request replaces the first
	a.mu.Unlock()
	select {
	case <-h.reached:
	case <-time.After(time.Duration(wait) * time.Millisecond):
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if h.answer != nil {
		return h.answer, nil
	}
	if a.arm == h {
		a.arm = nil
	}
	return map[string]any{"held": false}, nil
}

func (a *Admin) current() map[string]any {
	out := map[string]any{}
	for k, v := range a.switches {
		if rates[k] {
			out[k] = v
		} else {
			out[k] = int64(v)
		}
	}
	return out
}

func (a *Admin) setFaults(body []byte) (map[string]any, *refusal) {
	a.mu.Lock()
	offered := make([]string, 0, len(a.switches))
	for k := range a.switches {
		offered = append(offered, k)
	}
	a.mu.Unlock()
	sort.Strings(offered)
	numbers, raw, bad := object(body, offered)
	if bad != nil {
		return nil, bad
	}
	next := map[string]float64{}
	for field := range raw {
		if !rates[field] {
			v, bad := whole(numbers, raw, field, -1<<53, 1<<53)
			if bad != nil {
				return nil, bad
			}
			next[field] = float64(v)
			continue
		}
		n, ok := numbers[field]
		v, err := n.Float64()
		if !ok || err != nil {
			return nil, refuse(field, "%s must be a number", field)
		}
		if v < 0 || v > 1 {
			return nil, refuse(field, "%s must be within 0..=1, got %v", field, v)
		}
		next[field] = v
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, v := range next {
		a.switches[k] = v
	}
	return a.current(), nil
}

// ServeHTTP answers the protocol's routes under /admin/.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reply := func(status int, body any) {
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	}
	if !a.Enabled() {
		http.NotFound(w, r)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+a.token {
		reply(http.StatusUnauthorized, map[string]any{"error": "a bearer token is required", "field": nil})
		return
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	var answer map[string]any
	var bad *refusal
	switch r.Method + " " + r.URL.Path {
	case "GET /admin/points":
		answer = map[string]any{"points": a.points}
	case "GET /admin/faults":
		a.mu.Lock()
		answer = a.current()
		a.mu.Unlock()
	case "POST /admin/faults":
		answer, bad = a.setFaults(body)
	case "POST /admin/hold":
		answer, bad = a.hold(body)
	default:
		reply(http.StatusNotFound, map[string]any{"error": "no route " + r.Method + " " + r.URL.Path, "field": nil})
		return
	}
	if bad != nil {
		var field any
		if bad.field != "" {
			field = bad.field
		}
		reply(http.StatusUnprocessableEntity, map[string]any{"error": bad.err, "field": field})
		return
	}
	reply(http.StatusOK, answer)
}

// ListenAndServe serves the protocol on addr until it fails; it returns nil at
// once when no token is set.
func (a *Admin) ListenAndServe(addr string) error {
	if !a.Enabled() {
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", a)
	return http.ListenAndServe(addr, mux)
}
