#!/usr/bin/env bash
# e2e/guidellm/run.sh at each concurrency level, once per GuideLLM data seed, then pool.py
# over every report (not CI).
#   LEVELS="8 16" SEEDS="3 1 4" SPEEDUP=2 DATA=... e2e/guidellm/repeat.sh
# Defaults: kvroute and the real peers (sglang-router, vllm-router cache_aware), clock x2,
# levels 8 and 16, 3 seeds drawn at random (printed). Pooled table: $OUT/pooled.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE/out/repeat}
LEVELS=${LEVELS:-8 16}
export SPEEDUP=${SPEEDUP:-2}
export POLICIES=${POLICIES-kvroute}
export PEERS=${PEERS-sglang-router vllm-router}
if [ -z "${SEEDS:-}" ]; then
  SEEDS=$(for _ in 1 2 3; do echo $((RANDOM * 32768 + RANDOM)); done | tr '\n' ' ')
fi
echo "seeds: $SEEDS"
for seed in $SEEDS; do
  for level in $LEVELS; do
    OUT="$OUT/s$seed-c$level" STREAMS=$level SEED=$seed "$HERE/run.sh"
  done
done
"$HERE/.venv/bin/python" "$HERE/pool.py" --speedup "$SPEEDUP" --json "$OUT/figures.json" \
  "$OUT"/s*-c*/guidellm-*.json \
  | tee "$OUT/pooled.md"
