#!/usr/bin/env bash
# Where the router's own CPU goes per request: runs `kvroute bench --mode live` (kvroute only,
# text prompts, so the router tokenizes them) and samples the router process with `perf`,
# then sorts the samples into the router's parts by the frames on their stacks.
#
#   scripts/profile-router.sh [OUT_DIR] [-- extra `kvroute bench` flags]
#
# Needs perf (Debian: linux-perf) and a release build with debug info
# (`cargo build --release -p kvroute-cli`; the release profile keeps line tables).
# Default shape: the x10 shared-prefix run of the peers comparison (bench/README.md).
# Prints samples per part and milliseconds of CPU per request (samples / rate / requests).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/profile-router}
shift || true
[ "${1:-}" = "--" ] && shift
EXE=${KVROUTE:-target/release/kvroute}
RATE=${PERF_RATE:-2000}
SPEEDUP=${SPEEDUP:-10}
[ -x "$EXE" ] || { echo "build first: cargo build --release -p kvroute-cli" >&2; exit 1; }
command -v perf >/dev/null || { echo "perf not found (apt-get install linux-perf)" >&2; exit 1; }
mkdir -p "$OUT"
ARGS=(--workload shared-prefix --sessions 72 --prefixes 8 --prefix-tokens 1024
  --question-tokens 128 --output-tokens 16 --concurrency 8 --concurrency-sweep 4,8)
[ $# -gt 0 ] && ARGS=("$@")
KVROUTE_EXE=$EXE KVROUTE_BENCH_SPEEDUP=$SPEEDUP KVROUTE_BENCH_PROMPT=text \
  "$EXE" bench --mode live --workers 3 --policies kvroute "${ARGS[@]}" \
  --json "$OUT/bench.json" >"$OUT/bench.log" 2>&1 &
bench=$!
pid=
for _ in $(seq 1 120); do
  pid=$(pgrep -f "$EXE router " | head -1 || true)
  [ -n "$pid" ] && break
  sleep 0.25
done
[ -n "$pid" ] || { echo "no router process appeared" >&2; wait $bench; exit 1; }
perf record -F "$RATE" -g --call-graph dwarf,16384 -p "$pid" -o "$OUT/perf.data" \
  >"$OUT/perf.log" 2>&1 &
perf_pid=$!
wait $bench
kill -INT $perf_pid 2>/dev/null || true
wait $perf_pid || true
perf script -i "$OUT/perf.data" -F comm,tid,time,ip,sym >"$OUT/perf.txt" 2>/dev/null
python3 - "$OUT" "$RATE" <<'PY'
import json, sys
out, rate = sys.argv[1], float(sys.argv[2])
bench = json.load(open(f"{out}/bench.json"))
# Every request the router routed: the headline run's and each sweep level's.
requests = sum(p.get("requests", 0) + sum(pt.get("requests", 0) for pt in p.get("sweep", []))
               for w in bench["workloads"].values() for p in w.values())
# First matching rule wins: start-up first, then the decision, then the relay.
rules = [
    ("start-up: tokenizer load", ("Tokenizers::load", "Tokenizer::from_files",
        "tokenizers::tokenizer::serialization", "FastBpe::from_json")),
    ("decision: tokenize", ("RouterState>::tokenize",)),
    ("decision: other (plan, index, predict)", ("RouterState>::pick", "RouterState>::decide")),
    ("sidecar reports (gRPC ingest)", ("ingest", "tonic")),
    # Within the HTTP part: JSON (the client's body decoded, each streamed chunk classified)
    # and metrics (per-token inter-token latency among them).
    ("HTTP: JSON (request decode, chunk classification)", ("serde_json", "inspect_chunk")),
    ("metrics (prometheus)", ("prometheus",)),
    ("HTTP: client connection, upstream, SSE relay", ("hyper", "reqwest", "gateway::proxy")),
]
counts = {}
for sample in open(f"{out}/perf.txt").read().strip().split("\n\n"):
    part = next((name for name, pats in rules if any(p in sample for p in pats)), "other (runtime, kernel)")
    counts[part] = counts.get(part, 0) + 1
print(f"{requests} requests; {sum(counts.values())} samples at {rate:.0f} Hz")
print("| part | samples | CPU ms | CPU ms per request |")
print("|---|---:|---:|---:|")
for name, n in sorted(counts.items(), key=lambda kv: -kv[1]):
    ms = n / rate * 1000
    per = "-" if name.startswith("start-up") else f"{ms / max(requests, 1):.2f}"
    print(f"| {name} | {n} | {ms:.0f} | {per} |")
PY
