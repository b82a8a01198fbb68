#!/usr/bin/env bash
# sglang-router 0.3.2 and vllm-router 0.1.17 (published wheels: cache_aware, and vllm-router's
# kv_aware where it comes up) against
# live mock workers, measured by kvroute's own load generator next to kvroute's policies on
# the same workload, in one table (not CI).
#   e2e/peers/run.sh                        # --quick shared-prefix
#   BENCH_ARGS="--workload shared-prefix,multi-turn --sessions 48" e2e/peers/run.sh
#   WORKERS=1 DIRECT=1 ... e2e/peers/run.sh  # also a row sent straight to the one worker,
#                                            # so that each router's added latency shows
# Needs: python3 with venv, curl, a built `kvroute` (cargo build -p kvroute-cli).
# Writes $OUT/peers.json, $OUT/peers.md, $OUT/svg/.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${VENV:-$HERE/.venv}
OUT=${OUT:-$HERE/out}
WORKERS=${WORKERS:-3}
POLICIES=${POLICIES:-random,least-loaded,sglang-cache-aware,kvroute}
BENCH_ARGS=${BENCH_ARGS:---quick --workload shared-prefix}
# The binary that runs the bench (load generator); its components are $KVROUTE (deploy.sh),
# e.g. KVROUTE=target/release/kvroute BENCH_EXE=target/debug/kvroute.
BENCH_EXE=${BENCH_EXE:-}
SGLANG_PORT=${SGLANG_PORT:-30000}
VLLM_ROUTER_PORT=${VLLM_ROUTER_PORT:-30010}
VLLM_KV_PORT=${VLLM_KV_PORT:-30020}
source "$ROOT/e2e/guidellm/deploy.sh"
mkdir -p "$OUT"

PEER_VENV=$VENV
ensure_peer_venv
[ -x "$KVROUTE" ] || { echo "build kvroute first: cargo build -p kvroute-cli" >&2; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
trap stop_all EXIT

# The peers' workers: same binary, profile and speed-up as the ones `kvroute bench` starts for
# its own policies, no sidecars; they bind their KV-event sockets for vllm-router's kv_aware.
KV_BIND=1 start_workers "$WORKERS"
read -r -a urls <<<"$(worker_urls "$WORKERS")"
start_peer sglang-router "$SGLANG_PORT" "${urls[@]}"
start_peer vllm-router "$VLLM_ROUTER_PORT" "${urls[@]}"
# vllm-router's kv_aware policy reads the workers' KV events (ZMQ, as from vLLM); where it
# does not come up, its row is left out and the log says why.
kv_sources=()
for ((i = 0; i < WORKERS; i++)); do
  kv_sources+=(--kv-event-source "${urls[$i]}=tcp://127.0.0.1:$((PUB_BASE + i))"
    --kv-event-replay-source "${urls[$i]}=tcp://127.0.0.1:$((REPLAY_BASE + i))")
done
"$VENV/bin/vllm-router" --host 127.0.0.1 --port "$VLLM_KV_PORT" \
  --worker-urls "${urls[@]}" --policy kv_aware "${kv_sources[@]}" --kv-event-block-size 16 \
  --kv-event-model "$TOKENIZER" \
  --prometheus-port 29020 >"$LOGS/vllm-router-kv.log" 2>&1 &
PIDS+=($!)
wait_url "http://127.0.0.1:$SGLANG_PORT/health" 120
wait_url "http://127.0.0.1:$VLLM_ROUTER_PORT/health" 120
externals="sglang-router-cache-aware=http://127.0.0.1:$SGLANG_PORT,vllm-router-cache-aware=http://127.0.0.1:$VLLM_ROUTER_PORT"
if wait_url "http://127.0.0.1:$VLLM_KV_PORT/health" 60; then
  externals+=",vllm-router-kv-aware=http://127.0.0.1:$VLLM_KV_PORT"
else
  echo "vllm-router kv_aware did not come up; its row is left out (log: $LOGS/vllm-router-kv.log)" >&2
fi

if [ -n "${DIRECT:-}" ]; then
  [ "$WORKERS" = 1 ] || { echo "DIRECT=1 needs WORKERS=1 (no router: one worker)" >&2; exit 1; }
  externals+=",direct-to-worker=${urls[0]}"
fi

# kvroute's policies run on fresh deployments of their own; the peers on the workers above,
# whose caches the bench resets before each run. Prompts go as text (the workload's token ids
# decoded): sglang-router rejects token-id prompts; every row gets the same text.
KVROUTE_EXE=$KVROUTE KVROUTE_BENCH_SPEEDUP=$SPEEDUP KVROUTE_BENCH_PROMPT=text \
KVROUTE_BENCH_EXTERNAL_ROUTERS="$externals" \
KVROUTE_BENCH_EXTERNAL_WORKERS="$(echo "${urls[*]}" | tr ' ' ',')" \
  "${BENCH_EXE:-$KVROUTE}" bench --mode live --workers "$WORKERS" --policies "$POLICIES" $BENCH_ARGS \
  --json "$OUT/peers.json" --markdown "$OUT/peers.md" --svg-dir "$OUT/svg"
echo "logs: $LOGS"
