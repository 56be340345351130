#!/usr/bin/env bash
# Starts the shop's API and two workers at once on a fresh SQLite file, N times
# (default 60), and counts the processes that died within two seconds: the
# race of three processes creating one database that killed a worker in CI.
# Run it beside a CPU load (e.g. three `yes > /dev/null`) to widen the race.
# Everything is on 127.0.0.1 and in a temporary folder, removed at the end.
#
#   (go build -o bin/shop .) && ./start-race.sh 60
set -u
here=$(cd "$(dirname "$0")" && pwd)
shop=$here/bin/shop
[ -x "$shop" ] || { echo "build the shop first: (cd $here && go build -o bin/shop .)" >&2; exit 2; }
command -v nats-server > /dev/null || { echo "nats-server is not installed (scripts/brokers installs it)" >&2; exit 2; }
n=${1:-60}
port=${NATS_PORT:-14222}
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2> /dev/null; wait 2> /dev/null; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
export HAUNT_ADMIN_TOKEN=start-race
died=0
for i in $(seq 1 "$n"); do
  d=$tmp/$i
  mkdir -p "$d"
  nats-server -js -a 127.0.0.1 -p "$port" -sd "$d/nats" > "$d/nats.log" 2>&1 &
  pids=($!)
  for _ in $(seq 1 50); do (echo > "/dev/tcp/127.0.0.1/$port") 2> /dev/null && break; sleep 0.1; done
  common=(--variant fixed --db "$d/shop.db" --nats "nats://127.0.0.1:$port")
  "$shop" api "${common[@]}" --listen 127.0.0.1:$((port + 1)) > "$d/api.log" 2>&1 &
  pids+=($!)
  for w in 1 2; do
    "$shop" worker "${common[@]}" --id "worker-$w" --admin-listen "127.0.0.1:$((port + 1 + w))" > "$d/worker-$w.log" 2>&1 &
    pids+=($!)
  done
  sleep 2
  for p in "${pids[@]:1}"; do
    if ! kill -0 "$p" 2> /dev/null; then
      died=$((died + 1))
      echo "start $i: a process died:" $(cat "$d"/api.log "$d"/worker-*.log | grep -i "busy\|locked\|schema\|journal" | head -1)
    fi
  done
  kill "${pids[@]}" 2> /dev/null
  wait 2> /dev/null
  pids=()
done
echo "$died of $((3 * n)) processes died at start in $n starts"
[ "$died" -eq 0 ]
