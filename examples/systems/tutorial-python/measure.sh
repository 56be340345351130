#!/usr/bin/env bash
# Runs both variants of the tutorial shop under haunt, seed after seed, and
# prints one line per run: variant, seed, time limit, verdict, anomalies (with
# the projection's direction), the faults that fired. The table in
# docs/your-system.md comes from this script.
#
#   examples/systems/tutorial-python/measure.sh [SEEDS] [TIME_LIMIT_S] [EXTRA haunt run ARGS...]
#
# Needs `haunt` on PATH or HAUNT=path/to/haunt. Every run stays on 127.0.0.1
# and stops by itself; the run directories go to a temporary store, removed
# at the end unless KEEP=1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
haunt="${HAUNT:-haunt}"
seeds="${1:-10}"
limit="${2:-30}"
shift $(( $# > 2 ? 2 : $# ))
store="$(mktemp -d)"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$store"' EXIT
printf '%-6s %4s %4s %-8s %s\n' variant seed s verdict "anomalies | faults fired"
for variant in naive fixed; do
    for seed in $(seq 1 "$seeds"); do
        "$haunt" run --system "$here/$variant.toml" --seed "$seed" --time-limit-s "$limit" \
            --store "$store" --quiet "$@" >/dev/null 2>"$store/stderr" || true
        run="$(readlink -f "$store/latest")"
        python3 - "$variant" "$seed" "$limit" "$run" "$store/stderr" <<'PY'
import json, sys
variant, seed, limit, run, stderr = sys.argv[1:]
try:
    results = json.load(open(f"{run}/results.json"))
    runfile = json.load(open(f"{run}/run.json"))
except OSError:
    print(f"{variant:<6} {seed:>4} {limit:>4} error    {open(stderr).read().strip()[:200]}")
    sys.exit(0)
verdict = {True: "valid", False: "INVALID"}.get(results["valid"], "unknown")
found = []
for name, report in sorted(results["anomalies"].items()):
    if report["count"]:
        dirs = sorted({e.get("direction") for e in report["examples"] if e.get("direction")})
        found.append(f"{name} {report['count']}" + (f" ({'/'.join(dirs)})" if dirs else ""))
fired = ", ".join(f"{k} {v}" for k, v in sorted(runfile.get("faults_fired", {}).items()))
print(f"{variant:<6} {seed:>4} {limit:>4} {verdict:<8} {'; '.join(found) or '-'} | {fired}")
PY
    done
done
