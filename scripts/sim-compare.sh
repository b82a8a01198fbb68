#!/usr/bin/env bash
# kvroute alone with different values of one of `kvroute bench`'s simulation flags for the
# router's own rules (`--overcommit-margin`, `--rate-pool`), in simulation, on the shapes
# bench/README.md reports for such a rule: the default suite's 14 seed sets, kinference and
# kinference-hetero, the disagreement and long-short shapes, and the live shapes simulated
# on the live re-runs' seeds. kvroute alone: these rules are kvroute's and move no baseline.
#
#   scripts/sim-compare.sh OUT FLAG VALUE...
#
# VALUE `default` runs without the flag (the router's default). Writes OUT/<value>/<file>.json
# for each value and prints a summary with scripts/sim-compare-summary.py. About 6 minutes
# per value on a 2-core machine with a release build (KVROUTE, default
# target/release/kvroute).
set -euo pipefail
usage="usage: sim-compare.sh OUT FLAG VALUE... (e.g. OUT --rate-pool 0 default)"
out=${1:?$usage}
flagname=${2:?$usage}
shift 2
values=("$@")
[ ${#values[@]} -gt 0 ] || { echo "$usage" >&2; exit 2; }
bin=${KVROUTE:-target/release/kvroute}
[ -x "$bin" ] || { echo "no $bin: cargo build --release -p kvroute-cli" >&2; exit 1; }

# The default suite's seed sets: the four tuned on first, then ten drawn at random
# (bench/README.md, "KV-block balance near a full cache").
default_seeds="42 7001 9123 469230029 1661861031 498677416 1121021027 1203141611 1577297384
1160472425 1586353599 1769201752 809476403 2051192300"
# The live re-runs' seeds (multi-turn; hot-prefix and burst), simulated at their shapes.
live_mt_seeds="210357577 483481523 872446507"
live_dis_seeds="642781104 1020218965 499400433"

for m in "${values[@]}"; do
  dir=$out/$m
  mkdir -p "$dir"
  flag=()
  [ "$m" = default ] || flag=("$flagname" "$m")
  run() { # name args...
    local name=$1
    shift
    "$bin" bench --mode sim --policies kvroute "${flag[@]}" "$@" --json "$dir/$name.json" \
      >/dev/null 2>"$dir/$name.log" || { echo "failed: $name (see $dir/$name.log)" >&2; exit 1; }
    rm -f "$dir/$name.log"
  }
  for s in $default_seeds; do
    for w in shared-prefix multi-turn independent mixed; do
      run "$w-$s" --seed "$s" --repeats 4 --concurrency-sweep 32 --workload "$w"
    done
  done
  run kinference --scenario kinference --seed 578303223 --seeds 5
  run kinference-hetero --scenario kinference-hetero --seed 789817675 --seeds 5
  run disagree --workload hot-prefix,burst --repeats 2 --seed 166785029 --concurrency 32 \
    --concurrency-sweep 16,32,48 --generic-prior --prefix-tokens 16384 --question-tokens 1024 \
    --output-tokens 128 --profile l40s-27b-fp8
  run long-short --workload long-short --repeats 2 --seed 1693627883 --concurrency 32 \
    --concurrency-sweep 16,32,48 --generic-prior --profile l40s-27b-fp8
  run long-short-kv --workload long-short --repeats 2 --seed 1693627883 --concurrency 16 \
    --concurrency-sweep 8,16,24 --generic-prior --profile l40s-qwen3-32b-fp8 --sessions 192 \
    --prefixes 8 --prefix-tokens 4096 --question-tokens 4096 --output-tokens 512
  for s in $live_mt_seeds; do
    run "live-multi-turn-$s" --seed "$s" --repeats 1 --profile l40s-qwen3-32b-fp8 \
      --workload multi-turn --sessions 48 --turns 4 --first-turn-tokens 2048 \
      --question-tokens 128 --output-tokens 32 --concurrency 8 --concurrency-sweep 8,16
  done
  for s in $live_dis_seeds; do
    run "live-hot-prefix-$s" --seed "$s" --repeats 1 --profile l40s-qwen3-32b-fp8 \
      --workload hot-prefix,burst --sessions 96 --prefixes 8 --prefix-tokens 8192 \
      --question-tokens 512 --output-tokens 32 --concurrency 16 --concurrency-sweep 16
  done
done
python3 "$(dirname "$0")/sim-compare-summary.py" "${values[@]/#/$out/}"
