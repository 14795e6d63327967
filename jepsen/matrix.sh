#!/usr/bin/env bash
# The long Jepsen matrix: every workload under every nemesis (or the ones given), each a fresh
# cluster for --time-limit seconds (default 120), then one table of what was run and found.
#
#   jepsen/matrix.sh [--time-limit S] [--workloads "register set bank append"]
#                    [--nemeses "kill pause partition clock power-loss membership all"] [--nodes 3|5]
#                    [--concurrency N] [--seed S] [--base-port P] [--out FILE]
#
# Each run is `jepsen/run.sh` (which installs and builds what is missing) with seed S + its
# position (default S = 1000), so a matrix is reproducible. The table (Markdown, also written
# to FILE, default jepsen/store/matrix-<UTC time>.md) gives per run: workload, nemesis, nodes,
# seconds, faults injected, operations ok/fail/info, operations checked, anomalies, checker
# time, verdict and result directory. Exit status 0 iff every run was valid.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TIME_LIMIT=120
WORKLOADS="register set bank append"
NEMESES="kill pause partition clock power-loss membership all"
NODES=3
CONCURRENCY=""
SEED=1000
BASE_PORT=23600
OUT=""
while (($#)); do
  case "$1" in
    --time-limit) TIME_LIMIT="$2"; shift 2 ;;
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --nemeses) NEMESES="$2"; shift 2 ;;
    --nodes) NODES="$2"; shift 2 ;;
    --concurrency) CONCURRENCY="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    --base-port) BASE_PORT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "matrix.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
STORE="$ROOT/jepsen/store"
mkdir -p "$STORE"
OUT="${OUT:-$STORE/matrix-$(date -u +%Y%m%dT%H%M%SZ).md}"

rows=()
failed=0
i=0
read -r -a workloads <<<"$WORKLOADS"
read -r -a nemeses <<<"$NEMESES"
total=$((${#workloads[@]} * ${#nemeses[@]}))
for workload in "${workloads[@]}"; do
  for nemesis in "${nemeses[@]}"; do
    i=$((i + 1))
    seed=$((SEED + i))
    echo "==> matrix [$i/$total]: $workload × $nemesis, ${TIME_LIMIT}s, $NODES nodes, seed $seed"
    extra=(--nodes "$NODES")
    [[ -n "$CONCURRENCY" ]] && extra+=(--concurrency "$CONCURRENCY")
    log="$(mktemp)"
    "$ROOT/jepsen/run.sh" --workload "$workload" --nemesis "$nemesis" --time-limit "$TIME_LIMIT" \
      --seed "$seed" --base-port "$BASE_PORT" "${extra[@]}" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    dir="$(sed -n 's/^  run directory //p' "$log" | tail -1)"
    rm -f "$log"
    ((status == 0)) || failed=$((failed + 1))
    if [[ -n "$dir" && -f "$dir/results.json" ]]; then
      rows+=("$(python3 - "$dir" "$status" <<'EOF'
import json, sys, os
d = json.load(open(os.path.join(sys.argv[1], "results.json")))
t = d.get("ops_total", {})
anomalies = sum(len(c.get("anomalies", [])) for c in d.get("checkers", []))
verdict = {"0": "valid"}.get(sys.argv[2], f"exit {sys.argv[2]}")
print(f"| {d['workload']} | {d['nemesis']} | {d['nodes']} | {d['time_limit_s']} | "
      f"{len(d.get('nemesis_intervals', []))} | {t.get('ok', 0)}/{t.get('fail', 0)}/{t.get('info', 0)} | "
      f"{d.get('ops_checked', 0)} | {anomalies} | {d.get('check_ms', 0)} | {verdict} | "
      f"{os.path.basename(sys.argv[1])} |")
EOF
)")
    else
      rows+=("| $workload | $nemesis | $NODES | $TIME_LIMIT | - | - | - | - | - | exit $status (no results) | - |")
    fi
  done
done

{
  echo "| workload | nemesis | nodes | s | faults | ops ok/fail/info | checked | anomalies | check ms | verdict | run |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "$((total - failed)) of $total runs valid."
} | tee "$OUT"
echo "matrix: table in $OUT"
((failed == 0))
