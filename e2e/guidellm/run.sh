#!/usr/bin/env bash
# GuideLLM 0.8.1 through the kvroute gateway over live mock workers (not CI), and through
# the real peer routers over the same workers.
#   e2e/guidellm/run.sh                    # policies random and kvroute
#   POLICIES="random kvroute max-prefix" STREAMS=8 DURATION=30 e2e/guidellm/run.sh
#   POLICIES=none PEERS=sglang-router ...: only the peers
#   SEED=N: GuideLLM's data seed (its default is a fixed 42: every run the same prompts)
#   PEERS="sglang-router vllm-router" e2e/guidellm/run.sh
#     also sglang-router 0.3.2 and vllm-router 0.1.17 (cache_aware; installed into
#     e2e/peers/.venv as e2e/peers/run.sh does), each over fresh mock workers
#   PEER_SIDECARS=1: the peers' workers also publish KV events to kvroute's sidecars, which
#     stream to an idle kvroute router (a control: the same processes as kvroute's run)
# Needs: python3 with venv, curl, a built `kvroute` (cargo build -p kvroute-cli).
# Writes $OUT/guidellm-<policy>.json (GuideLLM's own report) and $OUT/summary.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${VENV:-$HERE/.venv}
OUT=${OUT:-$HERE/out}
WORKERS=${WORKERS:-3}
POLICIES=${POLICIES:-random kvroute}
[ "$POLICIES" = none ] && POLICIES=   # only the peers
STREAMS=${STREAMS:-8}
DURATION=${DURATION:-30}
PEERS=${PEERS:-}
PEER_VENV=${PEER_VENV:-$ROOT/e2e/peers/.venv}
PEER_PORT=${PEER_PORT:-30000}
# GuideLLM synthetic shared-prefix data (token counts in the Qwen3 tokenizer).
DATA=${DATA:-kind=synthetic_text,prompt_tokens=128,output_tokens=32,prefix_tokens=256,prefix_count=4}
source "$HERE/deploy.sh"
mkdir -p "$OUT"

if [ ! -x "$VENV/bin/guidellm" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet guidellm==0.8.1   # ~2.5 min, ~5.9 GB (CUDA torch; runs on CPU)
fi
if [ -n "$PEERS" ]; then ensure_peer_venv; fi
[ -x "$KVROUTE" ] || { echo "build kvroute first: cargo build -p kvroute-cli" >&2; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
trap stop_all EXIT

guidellm_run() { # NAME URL
  # validate_backend=false: GuideLLM probes GET /health on the target; the kvroute gateway
  # answers health on its admin port (/healthz), not on the OpenAI port.
  "$VENV/bin/guidellm" run \
    --backend "kind=openai_http,target=$2,model=$MODEL,validate_backend=false" \
    --tokenizer "kind=huggingface_auto,model=$TOKENIZER" \
    --data "$DATA" \
    --profile "kind=concurrent,streams=$STREAMS" \
    ${SEED:+--seed "kind=static,value=$SEED"} \
    --constraint "kind=max_duration,seconds=$DURATION" \
    --output "kind=json,path=$OUT/guidellm-$1.json" --output kind=console \
    --disable-progress
}

for policy in $POLICIES; do
  echo "== $policy: $WORKERS mock workers (x$SPEEDUP), sidecars, router; logs in $LOGS"
  start_kvroute "$policy" "$WORKERS"
  start_workers "$WORKERS"
  wait_routable "$WORKERS"
  guidellm_run "$policy" "http://127.0.0.1:$GW_PORT"
  stop_all   # fresh workers per policy: caches start cold
done

for peer in $PEERS; do
  echo "== $peer (cache_aware): $WORKERS mock workers (x$SPEEDUP); logs in $LOGS"
  if [ -n "${PEER_SIDECARS:-}" ]; then
    # A control: the workers publish KV events to kvroute's sidecars, which stream to a
    # kvroute router that gets no traffic, so the peer's workers share the machine with the
    # same processes as kvroute's do.
    start_kvroute kvroute "$WORKERS"
    start_workers "$WORKERS"
    wait_routable "$WORKERS"
  else
    # The same workers as kvroute's, without sidecars (nothing reads their KV events).
    KV_EVENTS=0 start_workers "$WORKERS"
  fi
  read -r -a urls <<<"$(worker_urls "$WORKERS")"
  start_peer "$peer" "$PEER_PORT" "${urls[@]}" || exit 2
  wait_url "http://127.0.0.1:$PEER_PORT/health" 120
  guidellm_run "$peer-cache-aware" "http://127.0.0.1:$PEER_PORT"
  stop_all
done

"$VENV/bin/python" "$HERE/summary.py" --speedup "$SPEEDUP" "$OUT"/guidellm-*.json | tee "$OUT/summary.md"
