#!/usr/bin/env bash
# e2e/peers/run.sh once per seed, then e2e/peers/pool.py over the runs (not CI).
#   SEEDS="3 1 4" SPEEDUP=2 e2e/peers/repeat.sh        # default: 3 seeds drawn at random
# Every run gets the same BENCH_ARGS (plus --seed); the pooled table goes to $OUT/pooled.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE/out/repeat}
if [ -z "${SEEDS:-}" ]; then
  SEEDS=$(for _ in 1 2 3; do echo $((RANDOM * 32768 + RANDOM)); done | tr '\n' ' ')
fi
BASE_ARGS=${BENCH_ARGS:---workload shared-prefix,multi-turn --concurrency 8 --concurrency-sweep 8,16}
echo "seeds: $SEEDS"
runs=()
for seed in $SEEDS; do
  OUT="$OUT/s$seed" BENCH_ARGS="$BASE_ARGS --seed $seed" "$HERE/run.sh"
  runs+=("$OUT/s$seed/peers.json")
done
"$HERE/pool.py" "${runs[@]}" | tee "$OUT/pooled.md"
