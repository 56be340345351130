#!/usr/bin/env bash
# Self-check of the tutorial shop, without haunt: start the API and two workers
# of one variant on a free loopback port in a temp dir, place orders (some of
# them retried with the same order_id, one conflicting, one malformed),
# optionally SIGKILL / SIGSTOP workers (and the API) while they run, wait for
# the queue to drain, and compare sum(qty) of the orders per item with the
# projection.
#
#   ./selfcheck.sh [--variant naive|fixed] [--orders N] [--clients C]
#                  [--faults K] [--kill-api] [--ack-fail-rate R]
#                  [--publish-delay-ms MS] [--keep]
#
# Exit status: 0 the run completed (and, for fixed, the projection matched);
# 1 fixed showed a mismatch, a lost order or a crashed process; 2 setup failed
# or the queue did not drain. For naive a mismatch is reported, not failed.
# Needs bash, python3 (standard library) and curl. Everything stays on 127.0.0.1,
# every loop is bounded, and every process started here is stopped on exit.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
variant=fixed orders=200 clients=4 faults=0 kill_api=0 keep=0 ack_fail_rate="" vt=2000 interval_ms=20 publish_delay_ms=0

while [ $# -gt 0 ]; do
  case "$1" in
    --variant) variant="$2"; shift 2 ;;
    --orders) orders="$2"; shift 2 ;;
    --clients) clients="$2"; shift 2 ;;
    --faults) faults="$2"; shift 2 ;;
    --kill-api) kill_api=1; shift ;;
    --ack-fail-rate) ack_fail_rate="$2"; shift 2 ;;
    --publish-delay-ms) publish_delay_ms="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "selfcheck: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$variant" in naive|fixed) ;; *) echo "selfcheck: --variant naive|fixed" >&2; exit 2 ;; esac
[ -n "$ack_fail_rate" ] || { [ "$variant" = naive ] && ack_fail_rate=0.1 || ack_fail_rate=0; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/shop-selfcheck.XXXXXX")"
db="$tmp/shop.db"
declare -a worker_pid=()
api_pid=""
client_pids=()
status=2

cleanup() {
  local pids=() p i
  for p in "${client_pids[@]}"; do pids+=("$p"); done
  [ -n "$api_pid" ] && pids+=("$api_pid")
  for p in "${worker_pid[@]}"; do pids+=("$p"); done
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -TERM "$p" 2>/dev/null || true; done
  for i in $(seq 1 30); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  if [ "$keep" = 1 ] || [ "$status" != 0 ]; then
    echo "selfcheck: logs and database kept in $tmp" >&2
  else
    rm -rf "$tmp"
  fi
}
trap 'cleanup' EXIT
trap 'exit 130' INT TERM

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

port="$(free_port)"
base="http://127.0.0.1:$port"

start_api() {
  python3 "$here/api.py" --variant "$variant" --listen "127.0.0.1:$port" --db "$db" \
    --publish-delay-ms "$publish_delay_ms" >>"$tmp/api.log" 2>&1 &
  api_pid=$!
}

start_worker() {  # $1: instance number
  python3 "$here/worker.py" --variant "$variant" --db "$db" --id "worker-$1" \
    --visibility-timeout-ms "$vt" --ack-fail-rate "$ack_fail_rate" >>"$tmp/worker-$1.log" 2>&1 &
  worker_pid[$1]=$!
}

wait_ready() {
  local i
  for i in $(seq 1 100); do
    curl -fsS -m 1 "$base/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "selfcheck: the API did not become ready on $base; its log:" >&2
  tail -n 20 "$tmp/api.log" >&2
  return 1
}

# One client: places its share of orders; every 7th order is sent twice (the
# retry must answer 200 with the same event_id); a connection error or a 5xx is
# retried with the same order_id, a bounded number of times. Writes one line
# per logical order: order_id item_id qty final_status event_id.
client() {  # $1: client number, $2: number of orders
  local c="$1" n="$2" k item qty body code out try sends s
  for k in $(seq 1 "$n"); do
    item="item-$((RANDOM % 5))"
    qty=$((1 + RANDOM % 5))
    body="{\"order_id\": \"o-$c-$k\", \"item_id\": \"$item\", \"qty\": $qty}"
    sends=1; [ $((k % 7)) = 0 ] && sends=2
    for s in $(seq 1 "$sends"); do
      code=000 out=""
      for try in $(seq 1 40); do
        # A transfer that breaks off (the API killed mid-answer) is indeterminate
        # whatever status line arrived: retried like a refused connection.
        if out="$(curl -sS -m 5 -o - -w ' %{http_code}' -H 'content-type: application/json' \
                  -X POST --data "$body" "$base/orders" 2>/dev/null)"; then
          code="${out##* }"
        else
          code=000
        fi
        case "$code" in 200|201|400|409) break ;; esac
        sleep 0.25
      done
      event_id=-
      [[ "$out" =~ \"event_id\":\ \"([^\"]+)\" ]] && event_id="${BASH_REMATCH[1]}"
      echo "o-$c-$k $item $qty $code $event_id $s" >>"$tmp/client-$c.log"
    done
    sleep "$(printf '%d.%03d' $((interval_ms / 1000)) $((interval_ms % 1000)))"
  done
}

echo "selfcheck: variant=$variant orders=$orders clients=$clients faults=$faults kill_api=$kill_api ack_fail_rate=$ack_fail_rate dir=$tmp"
start_api
wait_ready || exit 2
start_worker 1
start_worker 2

# Two requests that must be refused: a bad field, and a conflicting duplicate.
bad="$(curl -sS -m 5 -w ' %{http_code}' -H 'content-type: application/json' -X POST \
       --data '{"order_id": "bad-1", "item_id": "item-0", "qty": "two"}' "$base/orders")"
echo "selfcheck: malformed qty -> $bad"
curl -sS -m 5 -o /dev/null -H 'content-type: application/json' -X POST \
  --data '{"order_id": "conflict-1", "item_id": "item-0", "qty": 1}' "$base/orders"
conflict="$(curl -sS -m 5 -w ' %{http_code}' -H 'content-type: application/json' -X POST \
       --data '{"order_id": "conflict-1", "item_id": "item-1", "qty": 3}' "$base/orders")"
echo "selfcheck: conflicting duplicate -> $conflict"
case "$bad" in *' 400') ;; *) echo "selfcheck: expected 400" >&2; exit 1 ;; esac
case "$conflict" in *' 409') ;; *) echo "selfcheck: expected 409" >&2; exit 1 ;; esac

per=$(( (orders + clients - 1) / clients ))
for c in $(seq 1 "$clients"); do
  client "$c" "$per" &
  client_pids+=($!)
done

# The nemesis: K faults, one every ~0.5 s, each on a random worker (or the API
# once, with --kill-api): SIGKILL then start again, or SIGSTOP for longer than
# the visibility timeout then SIGCONT.
kills=0 pauses=0 api_kills=0
for f in $(seq 1 "$faults"); do
  sleep 0.5
  if [ "$kill_api" = 1 ] && [ "$api_kills" = 0 ] && [ "$f" -ge $(( (faults + 1) / 2 )) ]; then
    kill -KILL "$api_pid" 2>/dev/null || true; wait "$api_pid" 2>/dev/null || true
    echo "selfcheck: fault $f: SIGKILL api"
    sleep 0.3; start_api; wait_ready || exit 2
    api_kills=$((api_kills + 1)); continue
  fi
  i=$((1 + RANDOM % 2))
  if [ $((RANDOM % 2)) = 0 ]; then
    kill -KILL "${worker_pid[$i]}" 2>/dev/null || true; wait "${worker_pid[$i]}" 2>/dev/null || true
    echo "selfcheck: fault $f: SIGKILL worker-$i, restart"
    start_worker "$i"; kills=$((kills + 1))
  else
    kill -STOP "${worker_pid[$i]}" 2>/dev/null || true
    echo "selfcheck: fault $f: SIGSTOP worker-$i for $((vt + 500)) ms"
    sleep "$(printf '%d.%03d' $(( (vt + 500) / 1000 )) $(( (vt + 500) % 1000 )))"
    kill -CONT "${worker_pid[$i]}" 2>/dev/null || true; pauses=$((pauses + 1))
  fi
done

for p in "${client_pids[@]}"; do wait "$p" || true; done
client_pids=()

# Every process started here must still be running (a restarted one included).
crashed=0
for p in "$api_pid" "${worker_pid[@]}"; do kill -0 "$p" 2>/dev/null || crashed=1; done

# Drain: at most 90 s for the queue to empty.
drained=0
for i in $(seq 1 450); do
  left="$(python3 -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1], timeout=5); print(c.execute("SELECT count(*) FROM queue").fetchone()[0])' "$db" 2>/dev/null || echo '?')"
  if [ "$left" = 0 ]; then drained=1; break; fi
  sleep 0.2
done
[ "$drained" = 1 ] && echo "selfcheck: queue drained after ~$((i / 5)) s" || echo "selfcheck: queue NOT drained after 90 s ($left left)"

set +e
python3 - "$db" "$tmp" "$variant" "$drained" "$crashed" "$kills" "$pauses" "$api_kills" <<'PY'
import glob, os, sqlite3, sys
db, tmp, variant, drained, crashed = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5] == "1"
kills, pauses, api_kills = sys.argv[6:9]
conn = sqlite3.connect(db, timeout=5)
tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
print("rows:", ", ".join(f"{t}={conn.execute(f'SELECT count(*) FROM {t}').fetchone()[0]}" for t in tables))

statuses, acked, event_mismatch = {}, {}, 0
for path in glob.glob(os.path.join(tmp, "client-*.log")):
    for line in open(path):
        order_id, item, qty, code, event_id, send = line.split()
        statuses[code] = statuses.get(code, 0) + 1
        if code in ("200", "201"):
            if order_id in acked and acked[order_id] != event_id:
                event_mismatch += 1
            acked[order_id] = event_id
print("client answers:", ", ".join(f"{k}={v}" for k, v in sorted(statuses.items())),
      f"(acknowledged orders: {len(acked)}; a retry answered another event_id: {event_mismatch})")
present = {r[0]: r[1] for r in conn.execute("SELECT order_id, event_id FROM orders")}
lost = [o for o in acked if o not in present]
print(f"faults: worker SIGKILL={kills} SIGSTOP={pauses} api SIGKILL={api_kills}")

excluded = set()
if "dlq" in tables:
    excluded = {r[0] for r in conn.execute("SELECT event_id FROM dlq")}
pending = {r[0] for r in conn.execute("SELECT event_id FROM queue")}
expected = dict(conn.execute(
    "SELECT item_id, sum(qty) FROM orders GROUP BY item_id").fetchall())
for ev in excluded | pending:
    row = conn.execute("SELECT item_id, qty FROM orders WHERE event_id = ?", (ev,)).fetchone()
    if row and not (ev in pending and "inbox" in tables and
                    conn.execute("SELECT 1 FROM inbox WHERE event_id = ?", (ev,)).fetchone()):
        expected[row[0]] -= row[1]
projection = dict(conn.execute("SELECT item_id, reserved_qty FROM inventory").fetchall())
mismatches = 0
print("item      sum(qty of orders)  reserved_qty  verdict")
for item in sorted(set(expected) | set(projection)):
    want, got = expected.get(item, 0), projection.get(item, 0)
    verdict = "ok" if want == got else ("OVER by %d" % (got - want) if got > want else "UNDER by %d" % (want - got))
    mismatches += want != got
    print(f"{item:<9} {want:>18}  {got:>12}  {verdict}")
if "ledger" in tables:
    doubled = conn.execute("SELECT count(*) FROM (SELECT event_id FROM ledger GROUP BY event_id HAVING count(*) > 1)").fetchone()[0]
    unapplied = conn.execute(
        "SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM ledger l WHERE l.event_id = o.event_id)"
        " AND NOT EXISTS (SELECT 1 FROM queue q WHERE q.event_id = o.event_id)"
        " AND NOT EXISTS (SELECT 1 FROM dlq d WHERE d.event_id = o.event_id)").fetchone()[0]
    redelivered = conn.execute("SELECT count(*) FROM ledger WHERE delivery_attempt > 1").fetchone()[0]
    print(f"ledger: events applied twice={doubled}, orders never applied={unapplied}, applied on a redelivery={redelivered}")
    mismatches += doubled + unapplied
if "ledger" not in tables:
    # No ledger: the workers' logs are the only record of applications. They
    # tell the two naive mistakes apart (approximately: a SIGKILL between an
    # update and its log line is not seen): applications beyond one per event
    # push the projection over, lost read-modify-write updates pull it under.
    import re
    applied, per_event = {}, {}
    for path in glob.glob(os.path.join(tmp, "worker-*.log")):
        for m in re.finditer(r"applied event=(\S+) order=\S+ item=(\S+) qty=(\d+)", open(path, errors="replace").read()):
            applied[m.group(2)] = applied.get(m.group(2), 0) + int(m.group(3))
            per_event[m.group(1)] = per_event.get(m.group(1), 0) + 1
    extra = sum(n - 1 for n in per_event.values() if n > 1)
    never = sum(1 for ev in present.values() if ev not in per_event)
    lost_updates = sum(applied.get(i, 0) - projection.get(i, 0) for i in set(applied) | set(projection))
    print(f"from the worker logs: extra applications={extra} (events applied more than once: "
          f"{sum(1 for n in per_event.values() if n > 1)}), orders never applied={never}, "
          f"qty lost to read-modify-write races={lost_updates}")
tracebacks = 0
for path in glob.glob(os.path.join(tmp, "*.log")):
    tracebacks += open(path, errors="replace").read().count("Traceback")
counters = {"ack lost": 0, "duplicate skipped": 0, "lease lost": 0, "dead-lettered": 0, "error:": 0}
for path in glob.glob(os.path.join(tmp, "worker-*.log")):
    text = open(path, errors="replace").read()
    for k in counters:
        counters[k] += text.count(k)
print("worker logs:", ", ".join(f"{k.rstrip(':')}={v}" for k, v in counters.items()), f"tracebacks={tracebacks}")
print(f"lost acknowledged orders: {len(lost)}; processes alive at the end: {'no' if crashed else 'yes'}")
bad = mismatches or lost or event_mismatch
if not drained:
    print("RESULT: unknown (the queue did not drain)")
    sys.exit(2)
if tracebacks or crashed:
    print("RESULT: a process crashed")
    sys.exit(1)
if bad:
    print(f"RESULT: {variant}: {mismatches} mismatching item(s)/event(s), {len(lost)} lost order(s)"
          + (" (expected for naive)" if variant == "naive" else ""))
    sys.exit(0 if variant == "naive" else 1)
print(f"RESULT: {variant}: consistent")
sys.exit(0)
PY
status=$?
exit "$status"
