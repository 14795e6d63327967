#!/bin/bash
cd /work/main; T=/var/tmp/meridian-target/release
for round in 2 3 4 5; do for mode in on off etcd; do
  if [[ $mode == etcd ]]; then args="--stores etcd"; else args="--stores meridian -p earlylocks=$mode"; fi
  timeout 900 $T/meridian-ycsb economy-compare -P bench/workloads/closedeconomy --threads 64 -p operationcount=100000 -p seed=11 $args --out /tmp/el/r$round-$mode.md > /tmp/el/r$round-$mode.txt 2>&1
  echo "round $round $mode exit $?"; tail -1 /tmp/el/r$round-$mode.md
done; done
