#!/usr/bin/env bash
# How true kvroute's TTFT predictions and its published p90 bound are live (issue 16, item 6):
# `kvroute bench --mode live --policies kvroute` on five workload shapes (the peers
# comparison's x2 shapes, bench/README.md), once per seed, then the pooled table: per
# workload the median over the runs [min-max] of the median |predicted - observed| /
# observed TTFT after warm-up, and of the coverage of the bench's adaptive p90 bound and of
# the bound the router published with each decision (x-kvroute-ttft-p90-bound-ms).
#
#   scripts/live-prediction.sh [OUT_DIR]       # SEEDS="1 2 3" to fix the seeds
#
# The last column is the router's own count (kvroute_router_ttft_bound_total, read after the
# headline run): the same published bounds against the first token as the router serves it,
# from its receipt of the request. It differs from the column before in the clock (the
# router's, not the client's) and the set (the router also counts the warm-up's bounded
# requests).
#
# SHAPES (default "shared-prefix multi-turn disagree independent") picks shapes (with SCALE
# above 1, "disagree:hot-prefix" or "disagree:burst" picks one half of disagree); SCALE
# (default 1) multiplies every shape's sessions (and burst's prefixes, so its bursts keep
# their length), for longer runs: at 76 requests after
# warm-up a run's bound coverage has a standard deviation of about 3.4 points by chance
# alone, as wide as the 87-93% target.
#
# Needs a release build (`cargo build --release -p kvroute-cli`); SPEEDUP (default 2) is the
# mock workers' clock speed-up. About 3 minutes per seed on the 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/live-prediction}
EXE=${KVROUTE:-target/release/kvroute}
SPEEDUP=${SPEEDUP:-2}
[ -x "$EXE" ] || { echo "build first: cargo build --release -p kvroute-cli" >&2; exit 1; }
if [ -z "${SEEDS:-}" ]; then
  SEEDS=$(for _ in 1 2 3; do echo $((RANDOM * 32768 + RANDOM)); done | tr '\n' ' ')
fi
echo "seeds: $SEEDS"
SHAPES=${SHAPES:-shared-prefix multi-turn disagree independent}
SCALE=${SCALE:-1}
case $SCALE in '' | *[!0-9]* | 0) echo "SCALE must be a whole number >= 1" >&2; exit 2 ;; esac
mkdir -p "$OUT"
run() {
  # NAME is a shape, or SHAPE:PART for one part of a shape (its own output files; SHAPES
  # may name either)
  local part=$1 name=${1/:/-} shape=${1%%:*} seed=$2
  shift 2
  case " $SHAPES " in *" $shape "* | *" $part "*) ;; *) return 0 ;; esac
  KVROUTE_EXE=$EXE KVROUTE_BENCH_SPEEDUP=$SPEEDUP KVROUTE_BENCH_PROMPT=text \
    "$EXE" bench --mode live --workers 3 --policies kvroute "$@" --seed "$seed" \
    --json "$OUT/$name-$seed.json" --markdown "$OUT/$name-$seed.md" >"$OUT/$name-$seed.log" 2>&1
}
for seed in $SEEDS; do
  echo "seed $seed"
  run shared-prefix "$seed" --workload shared-prefix --sessions $((96 * SCALE)) --prefixes 8 \
    --prefix-tokens 2048 --question-tokens 128 --output-tokens 32 --concurrency 8 --concurrency-sweep 8
  run multi-turn "$seed" --workload multi-turn --sessions $((48 * SCALE)) --turns 4 --first-turn-tokens 2048 \
    --question-tokens 128 --output-tokens 32 --concurrency 8 --concurrency-sweep 8
  if [ "$SCALE" = 1 ]; then
    run disagree "$seed" --workload hot-prefix,burst --sessions 96 --prefixes 8 --prefix-tokens 8192 \
      --question-tokens 512 --output-tokens 32 --concurrency 16 --concurrency-sweep 16
  else
    # A burst is sessions / prefixes requests long: scale the prefixes with the sessions so
    # bursts keep their 12 requests (hot-prefix's shape does not depend on the count).
    run disagree:hot-prefix "$seed" --workload hot-prefix --sessions $((96 * SCALE)) --prefixes 8 --prefix-tokens 8192 \
      --question-tokens 512 --output-tokens 32 --concurrency 16 --concurrency-sweep 16
    run disagree:burst "$seed" --workload burst --sessions $((96 * SCALE)) --prefixes $((8 * SCALE)) \
      --prefix-tokens 8192 --question-tokens 512 --output-tokens 32 --concurrency 16 --concurrency-sweep 16
  fi
  run independent "$seed" --workload independent --sessions $((96 * SCALE)) --question-tokens 2048 \
    --output-tokens 32 --concurrency 8 --concurrency-sweep 8
done
python3 - "$OUT"/*.json <<'PY' | tee "$OUT/pooled.md"
import json, statistics, sys
rows = {}
seeds = set()
for path in sys.argv[1:]:
    run = json.load(open(path))
    seeds.add(run["config"]["seed"])
    for workload, policies in run["workloads"].items():
        q = policies.get("kvroute", {}).get("prediction")
        if q:
            rows.setdefault(workload, []).append(q)
def fmt(xs, pct=True):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    f = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x}")
    return f"{f(statistics.median(xs))} [{f(min(xs))}-{f(max(xs))}]"
print(f"{len(seeds)} seeds: {', '.join(map(str, sorted(seeds)))}. Median over the runs [min-max].\n")
print("| workload | runs | requests after warm-up (each) | median error (target <= 20%) | median bias | bench's adaptive p90 bound: coverage | router's published bound: coverage (target 87-93%) | the same bound on the router's own clock |")
print("|---|---:|---|---|---|---|---|---|")
for w in ["shared-prefix", "multi-turn", "hot-prefix", "burst", "independent"]:
    qs = rows.get(w, [])
    if not qs:
        continue
    print(f"| {w} | {len(qs)} | {'/'.join(str(q['requests']) for q in qs)} "
          f"| {fmt([q['median_rel_error'] for q in qs])} | {fmt([q['median_rel_bias'] for q in qs])} "
          f"| {fmt([q['p90_bound_coverage'] for q in qs])} | {fmt([q['published_bound_coverage'] for q in qs])} "
          f"| {fmt([q.get('router_bound_coverage') for q in qs])} |")
PY
