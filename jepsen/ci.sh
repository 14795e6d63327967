#!/usr/bin/env bash
# The short Jepsen matrix that scripts/test.sh (and so CI) runs after the unit and cluster tests:
# register and set under kill, pause, partition, clock and power-loss faults, bank and append
# (transactions) under kill, clock, partition, pause and power-loss faults, register, set and
# append under replica moves (membership), register, set and
# bank under the `all` mix, register with reads on parked leases under pauses, plus every
# negative control,
# each run a fresh 3-node cluster for JEPSEN_TIME_LIMIT seconds (default 20). A run passes when
# its history checks valid (for a negative control: when the control makes it invalid, which the
# harness checks itself). A run written "@S ..." runs S seconds instead. Ends with "jepsen: N passed, N failed"; exits non-zero if any failed.
# Results: jepsen/store/<workload>-<nemesis>-<UTC time>/ (history, results.json, timeline, logs).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TIME_LIMIT="${JEPSEN_TIME_LIMIT:-20}"
BASE_PORT="${JEPSEN_BASE_PORT:-23000}"

# workload nemesis [extra args...]
RUNS=(
  "register kill"
  "register pause"
  "register partition"
  "register clock"
  "register power-loss"
  "set kill"
  "set pause"
  "set partition"
  "set clock"
  "set power-loss"
  "bank kill"
  "bank clock"
  "append kill"
  "append partition"
  "bank partition"
  "append power-loss"
  # Replica moves: a key's shard loses its leader's or a follower's replica, which comes back
  # empty at the heal and catches up (the set run then reads every replica's RocksDB).
  "register membership"
  "set membership"
  "append membership"
  # Every fault mixed: kill, power loss (nodes on lazyfs), pause, partition, replica moves, and clock offsets,
  # jumps and strobes (libfaketime), within and beyond max_offset.
  "@30 register all"
  "@30 set all"
  "@30 bank all"
  "register partition --negative-control stale-read"
  "set kill --negative-control lost-ack"
  "bank partition --negative-control wrong-total"
  "append pause --negative-control fractured-read"
  # The schedule that found acknowledged adds lost by a replica catching up on > 4,096
  # entries in one apply (jepsen/evidence, fixed by 176d8a4): a follower fenced by a +2 s
  # clock, healed, then the leader fenced; 5 nodes, 40 s so one chain fits.
  "@40 set clock-chain --nodes 5 --concurrency 10"
  # Snapshot reads under skewed clocks (checked with real-time order per key: no stale read;
  # a causal reverse across shards is allowed under skew, see the README).
  "append clock"
  # The same with commit-wait (TxnOptions::linearizable): real-time order checked between all
  # transactions, clocks skewed or not.
  "append clock --linearizable --concurrency 10"
  # Reads on parked leases: each key written once per 5 s, read otherwise, so its shard
  # quiesces between writes and its leader serves the reads without waking it, while the
  # leaders are paused past their leases (the run fails if no read was served parked).
  "@40 register pause --shards 8 --keys 8 --write-gap-ms 5000"
  # Five nodes under partitions; seed 24's schedule has two bridges and a ring (each node
  # reaching only its two neighbours) besides isolations (`--plan-only` prints it).
  "@45 append partition --nodes 5 --seed 24"
)

passed=0
failed=0
failures=()
# The first run builds; later ones find the binaries up to date.
for i in "${!RUNS[@]}"; do
  read -r -a run <<<"${RUNS[$i]}"
  limit="$TIME_LIMIT"
  if [[ "${run[0]}" == @* ]]; then
    limit="${run[0]#@}"
    run=("${run[@]:1}")
  fi
  workload="${run[0]}"
  nemesis="${run[1]}"
  extra=("${run[@]:2}")
  port=$((BASE_PORT + i * 20))
  # A run's seed is its position unless it names one.
  seed=(--seed "$((i + 1))")
  [[ " ${extra[*]} " == *" --seed "* ]] && seed=()
  echo "==> jepsen [$((i + 1))/${#RUNS[@]}]: --workload $workload --nemesis $nemesis ${extra[*]} (${limit}s${seed[*]:+, seed $((i + 1))})"
  if "$ROOT/jepsen/run.sh" --workload "$workload" --nemesis "$nemesis" --time-limit "$limit" \
      "${seed[@]}" --base-port "$port" "${extra[@]}"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("${RUNS[$i]}")
  fi
done
if ((failed)); then
  printf 'jepsen: failed run: %s\n' "${failures[@]}"
fi
echo "jepsen: $passed passed, $failed failed"
((failed == 0))
