#!/usr/bin/env bash
# GuideLLM 0.8.1 through the kvroute gateway over live mock workers (not CI).
#   e2e/guidellm/run.sh                    # policies random and kvroute
#   POLICIES="random kvroute max-prefix" STREAMS=8 DURATION=30 e2e/guidellm/run.sh
# Needs: python3 with venv, curl, a built `kvroute` (cargo build -p kvroute-cli).
# Writes $OUT/guidellm-<policy>.json (GuideLLM's own report) and $OUT/summary.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VENV=${VENV:-$HERE/.venv}
OUT=${OUT:-$HERE/out}
WORKERS=${WORKERS:-3}
POLICIES=${POLICIES:-random kvroute}
STREAMS=${STREAMS:-8}
DURATION=${DURATION:-30}
# GuideLLM synthetic shared-prefix data (token counts in the Qwen3 tokenizer).
DATA=${DATA:-kind=synthetic_text,prompt_tokens=128,output_tokens=32,prefix_tokens=256,prefix_count=4}
source "$HERE/deploy.sh"
mkdir -p "$OUT"

if [ ! -x "$VENV/bin/guidellm" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet guidellm==0.8.1   # ~2.5 min, ~5.9 GB (CUDA torch; runs on CPU)
fi
[ -x "$KVROUTE" ] || { echo "build kvroute first: cargo build -p kvroute-cli" >&2; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
trap stop_all EXIT

for policy in $POLICIES; do
  echo "== $policy: $WORKERS mock workers (x$SPEEDUP), sidecars, router; logs in $LOGS"
  start_kvroute "$policy" "$WORKERS"
  start_workers "$WORKERS"
  wait_routable "$WORKERS"
  # validate_backend=false: GuideLLM probes GET /health on the target; the kvroute gateway
  # answers health on its admin port (/healthz), not on the OpenAI port.
  "$VENV/bin/guidellm" run \
    --backend "kind=openai_http,target=http://127.0.0.1:$GW_PORT,model=$MODEL,validate_backend=false" \
    --tokenizer "kind=huggingface_auto,model=$TOKENIZER" \
    --data "$DATA" \
    --profile "kind=concurrent,streams=$STREAMS" \
    --constraint "kind=max_duration,seconds=$DURATION" \
    --output "kind=json,path=$OUT/guidellm-$policy.json" --output kind=console \
    --disable-progress
  stop_all   # fresh workers per policy: caches start cold
done

"$VENV/bin/python" "$HERE/summary.py" --speedup "$SPEEDUP" "$OUT"/guidellm-*.json | tee "$OUT/summary.md"
