#!/usr/bin/env bash
# How often a kill of the shop's API lands between the dual-write variant's two
# writes, by how haunt aims it: one line per run with the verdict, the events
# lost, the kills, and of the aimed kills how many found work in flight. The
# table in docs/your-system.md comes from this script.
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
printf '%-7s %4s %4s %-8s %5s %5s %s\n' aim seed s verdict lost kills "aimed: in flight/asked"
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
starts = [op for op in history if op["process"] == "nemesis" and op["f"] == "kill" and "result" in op["value"]]
aims = [op["value"]["aim"] for op in starts if "aim" in op["value"]]
held = sum(1 for a in aims if a.get("held"))
print(f"{aim:<7} {seed:>4} {limit:>4} {verdict:<8} {lost:>5} {len(starts):>5} {held}/{len(aims)}")
PY
    done
done
