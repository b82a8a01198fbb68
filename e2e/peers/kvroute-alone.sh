#!/usr/bin/env bash
# kvroute's rows of e2e/peers/repeat.sh without the real peers: the same load generator, the
# same fresh deployment per policy, the same prompts as text, once per seed, so a new build's
# rows can be set beside peer rows measured earlier with the same BENCH_ARGS and seed (not CI).
#   KVROUTE=target/release/kvroute SPEEDUP=2 SEEDS="3 1 4" OUT=DIR \
#   BENCH_ARGS="--profile l40s-27b-fp8 --workload burst ..." e2e/peers/kvroute-alone.sh
# Writes $OUT/s<seed>/peers.json and peers.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
KVROUTE=${KVROUTE:-$ROOT/target/release/kvroute}
SPEEDUP=${SPEEDUP:-2}
POLICIES=${POLICIES:-kvroute}
OUT=${OUT:?set OUT}
: "${SEEDS:?set SEEDS}"
: "${BENCH_ARGS:?set BENCH_ARGS}"
[ -x "$KVROUTE" ] || { echo "build kvroute first: cargo build --release -p kvroute-cli" >&2; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
cd "$ROOT"
for seed in $SEEDS; do
  mkdir -p "$OUT/s$seed"
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
  KVROUTE_EXE=$KVROUTE KVROUTE_BENCH_SPEEDUP=$SPEEDUP KVROUTE_BENCH_PROMPT=text \
    "$KVROUTE" bench --mode live --workers 3 --policies "$POLICIES" $BENCH_ARGS --seed "$seed" \
    --json "$OUT/s$seed/peers.json" --markdown "$OUT/s$seed/peers.md"
done
