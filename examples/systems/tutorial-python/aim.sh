#!/usr/bin/env bash
# How often a kill of the shop's API lands between the dual-write variant's two
# writes, by how haunt aims it: one line per run with the verdict, the events
# lost, the kills, how many of them struck while a request was in flight at the
# API (read from the history), and of the aimed kills how many found work in
# flight. The table in docs/your-system.md comes from this script.
#
#   examples/systems/tutorial-python/aim.sh [SEEDS] [TIME_LIMIT_S] [AIM ...]
#
# AIM is haunt run's --aim: points (the API's hold point), client (from the
# client's side, the hold point unused) or blind; default: blind client points.
# Needs `haunt` on PATH or HAUNT=path/to/haunt. Every run stays on 127.0.0.1
# and stops by itself; the run directories go to a temporary store, removed
# at the end unless KEEP=1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
haunt="${HAUNT:-haunt}"
seeds="${1:-10}"
limit="${2:-30}"
shift $(( $# > 2 ? 2 : $# ))
aims=("$@")
[ ${#aims[@]} -gt 0 ] || aims=(blind client points)
store="$(mktemp -d)"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$store"' EXIT
printf '%-7s %4s %4s %-8s %5s %5s %-13s %s\n' aim seed s verdict lost kills "inside/kills" "aimed: held/asked"
for aim in "${aims[@]}"; do
    for seed in $(seq 1 "$seeds"); do
        "$haunt" run --system "$here/shop.toml" --variant dual-write --nemesis kill --fault-targets api \
            --aim "$aim" --seed "$seed" --time-limit-s "$limit" --store "$store" --quiet \
            >/dev/null 2>"$store/stderr" || true
        run="$(readlink -f "$store/latest")"
        python3 - "$aim" "$seed" "$limit" "$run" "$store/stderr" <<'PY'
import json, sys
aim, seed, limit, run, stderr = sys.argv[1:]
try:
    results = json.load(open(f"{run}/results.json"))
    history = [json.loads(line) for line in open(f"{run}/history.jsonl")]
except OSError:
    print(f"{aim:<7} {seed:>4} {limit:>4} error    {open(stderr).read().strip()[:200]}")
    sys.exit(0)
verdict = {True: "valid", False: "INVALID"}.get(results["valid"], "unknown")
lost = results["anomalies"].get("lost-effect", {}).get("count", 0)
kills = [op for op in history if op["process"] == "nemesis" and op["f"] == "kill"]
asked = [op for op in kills if "result" not in op["value"]]
struck = [op for op in kills if "result" in op["value"]]
aims = [op["value"]["aim"] for op in struck if "aim" in op["value"]]
held = sum(1 for a in aims if a.get("held"))
# A client request's span: from its invoke to its completion (none: to the end).
spans, open_at = [], {}
for op in history:
    if op["process"] == "nemesis":
        continue
    if op["type"] == "invoke":
        open_at[op["process"]] = op["time_ns"]
    elif op["process"] in open_at:
        spans.append((open_at.pop(op["process"]), op["time_ns"], op["type"]))
spans += [(t, float("inf"), "info") for t in open_at.values()]
# A kill struck with work in hand when a request was in flight as its signal
# went. The signal goes between the kill's start op and its result op: a
# request begun before the result that was still open after it, or was cut
# (info) after the start, counts.
inside = 0
for began, done in zip(asked, struck):
    t0, t1 = began["time_ns"], done["time_ns"]
    if any(a < t1 and (b > t1 or (kind == "info" and b >= t0)) for a, b, kind in spans):
        inside += 1
print(f"{aim:<7} {seed:>4} {limit:>4} {verdict:<8} {lost:>5} {len(struck):>5} {inside:>5}/{len(struck):<7} {held}/{len(aims)}")
PY
    done
done
