#!/usr/bin/env bash
# Shared by e2e/guidellm/run.sh and e2e/peers/run.sh (source it): starts a local kvroute
# deployment on loopback with fixed ports, the same way `kvroute bench --mode live` does.
#   start_kvroute POLICY N     `kvroute router --policy POLICY` (gateway :$GW_PORT) + N sidecars;
#                              ROUTER_LOG sets the router's RUST_LOG (default warn), e.g.
#                              warn,kvroute_router::decisions=debug for the decision log;
#                              ROUTER_ARGS adds flags (e.g. --rate-pool 0.5)
#   start_workers N            N x `kvroute mock-vllm` (L40S profile, clock x $SPEEDUP); with
#                              KV_EVENTS=1 (default) they publish to the sidecars, which must
#                              be started first (they bind the sockets); with KV_BIND=1 the
#                              workers bind them instead (for subscribers that connect)
#   wait_routable N            until the router lists N routable workers
#   stop_all                   stops everything this shell started
# Worker i: HTTP 127.0.0.1:$((WORKER_BASE+i)), KV events PUB $((PUB_BASE+i)), replay $((REPLAY_BASE+i)).

: "${ROOT:?set ROOT to the repository root}"
KVROUTE=${KVROUTE:-$ROOT/target/debug/kvroute}
TOKENIZER=${TOKENIZER:-$ROOT/testdata/tokenizers/qwen3}
PROFILE=${PROFILE:-l40s-qwen3-32b-fp8}
SPEEDUP=${SPEEDUP:-10}
MODEL=${MODEL:-qwen3-32b}
LOGS=${LOGS:-$(mktemp -d -t kvroute-peers-XXXX)}
WORKER_BASE=${WORKER_BASE:-18100}
PUB_BASE=${PUB_BASE:-18200}
REPLAY_BASE=${REPLAY_BASE:-18300}
GW_PORT=${GW_PORT:-18080}
GRPC_PORT=${GRPC_PORT:-18081}
ADMIN_PORT=${ADMIN_PORT:-18082}
PIDS=()
mkdir -p "$LOGS"

wait_url() { # URL [seconds]
  local url=$1 deadline=$((SECONDS + ${2:-60}))
  until curl -fsS -o /dev/null "$url"; do
    if ((SECONDS > deadline)); then echo "timeout waiting for $url (logs: $LOGS)" >&2; return 1; fi
    sleep 0.5
  done
}

worker_urls() { # N -> space-separated base URLs
  local i out=()
  for ((i = 0; i < $1; i++)); do out+=("http://127.0.0.1:$((WORKER_BASE + i))"); done
  echo "${out[*]}"
}

# Workers publish KV events to their sidecar's bound socket (started by start_kvroute) and
# serve /health, /server_info (model_path = the local tokenizer dir, so that sglang-router
# loads it instead of downloading one), /model_info, /get_load, /reset_prefix_cache.
# The InferenceWorkerSet of worker i: bench for one profile; bench-<profile> each when PROFILE
# lists several distinct ones (a heterogeneous pool).
worker_set() {
  local profiles distinct
  IFS=, read -r -a profiles <<<"$PROFILE"
  distinct=$(printf '%s\n' "${profiles[@]}" | sort -u | wc -l)
  if [ "$distinct" -le 1 ]; then echo bench; return; fi
  local p=${profiles[$(($1 % ${#profiles[@]}))]}
  p=$(basename "$p"); p=${p%.*}
  p=$(printf '%s' "$p" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')
  echo "bench-$p"
}

start_workers() {
  local n=$1 i profiles
  # PROFILE may list several (comma-separated): worker i runs entry i % count.
  IFS=, read -r -a profiles <<<"$PROFILE"
  for ((i = 0; i < n; i++)); do
    local events=() spec
    # KV_BIND=1: the worker binds its PUB and replay sockets (vLLM's behaviour for `tcp://*:N`)
    # for subscribers that connect, such as vllm-router's kv_aware policy; otherwise it
    # connects to the sidecar, which binds.
    local host=127.0.0.1
    if [ "${KV_BIND:-0}" = 1 ]; then host='*'; fi
    spec=$(printf '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://%s:%d","replay_endpoint":"tcp://%s:%d","topic":""}' \
      "$host" $((PUB_BASE + i)) "$host" $((REPLAY_BASE + i)))
    if [ "${KV_EVENTS:-1}" = 1 ]; then events=(--kv-events-config "$spec"); fi
    RUST_LOG=warn "$KVROUTE" mock-vllm --host 127.0.0.1 --port $((WORKER_BASE + i)) \
      --model "$TOKENIZER" --served-model-name "$MODEL" --tokenizer "$TOKENIZER" \
      --profile "${profiles[$((i % ${#profiles[@]}))]}" --speedup "$SPEEDUP" --seed "$i" --enable-prompt-tokens-details \
      "${events[@]}" >"$LOGS/worker-$i.log" 2>&1 &
    PIDS+=($!)
  done
  for ((i = 0; i < n; i++)); do wait_url "http://127.0.0.1:$((WORKER_BASE + i))/health"; done
}

start_kvroute() {
  local policy=$1 n=$2 i set yaml=$LOGS/workers.yaml
  # One InferenceWorkerSet per distinct profile (one per GPU type, as in a cluster): the
  # router pools prefill rates only within a set. The sets' names are worker_set_of's in
  # e2e/src/local.rs.
  {
    for set in $(for ((i = 0; i < n; i++)); do worker_set "$i"; done | sort -u); do
      local members=()
      for ((i = 0; i < n; i++)); do
        [ "$(worker_set "$i")" = "$set" ] && members+=("$i")
      done
      echo "---"
      echo "apiVersion: kvroute.dev/v1alpha1"
      echo "kind: InferenceWorkerSet"
      echo "metadata: {name: $set, namespace: bench}"
      echo "spec:"
      echo "  model: {name: Qwen/Qwen3-32B-FP8, servedName: $MODEL}"
      echo "  replicas: ${#members[@]}"
      echo "  engine: {mode: mock}"
      echo "status:"
      echo "  replicas: ${#members[@]}"
      echo "  readyReplicas: ${#members[@]}"
      echo "  workers:"
      for i in "${members[@]}"; do
        echo "    - {pod: worker-$i, address: \"127.0.0.1:$((WORKER_BASE + i))\", ready: true}"
      done
    done
  } >"$yaml"
  RUST_LOG=${ROUTER_LOG:-warn} "$KVROUTE" router --http-addr 127.0.0.1:$GW_PORT --grpc-addr 127.0.0.1:$GRPC_PORT \
    --admin-addr 127.0.0.1:$ADMIN_PORT --config "$yaml" --policy "$policy" \
    --tokenizer "$TOKENIZER" ${ROUTER_ARGS:-} >"$LOGS/router-$policy.log" 2>&1 &
  PIDS+=($!)
  wait_url "http://127.0.0.1:$ADMIN_PORT/healthz"
  for ((i = 0; i < n; i++)); do
    RUST_LOG=warn "$KVROUTE" sidecar --zmq-endpoint tcp://127.0.0.1:$((PUB_BASE + i)) --zmq-bind \
      --replay-endpoint tcp://127.0.0.1:$((REPLAY_BASE + i)) \
      --vllm-url http://127.0.0.1:$((WORKER_BASE + i)) --router http://127.0.0.1:$GRPC_PORT \
      --worker-id bench/worker-$i --worker-address 127.0.0.1:$((WORKER_BASE + i)) \
      --model "$MODEL" --block-size 16 --worker-set "$(worker_set "$i")" --admin-addr 127.0.0.1:0 \
      --scrape-interval-ms 100 --no-gpu >"$LOGS/sidecar-$i.log" 2>&1 &
    PIDS+=($!)
  done
}

wait_routable() {
  local n=$1 deadline=$((SECONDS + 60))
  until [ "$(curl -fsS "http://127.0.0.1:$ADMIN_PORT/debug/workers" | grep -o '"routable":true' | wc -l)" -ge "$n" ]; do
    if ((SECONDS > deadline)); then echo "workers never became routable (logs: $LOGS)" >&2; return 1; fi
    sleep 0.5
  done
}

# The peer routers' venv PEER_VENV: sglang-router 0.3.2 and vllm-router 0.1.17, installed on
# first use.
ensure_peer_venv() {
  if [ ! -x "$PEER_VENV/bin/vllm-router" ]; then
    python3 -m venv "$PEER_VENV"
    "$PEER_VENV/bin/pip" install --quiet sglang-router==0.3.2 vllm-router==0.1.17
  fi
}

# A real peer router in cache_aware mode over URL..., from PEER_VENV, serving PORT; its
# Prometheus metrics on 29000 (sglang-router) or 29010 (vllm-router). Logs in $LOGS/NAME.log;
# adds to PIDS.
start_peer() { # sglang-router|vllm-router PORT URL...
  local peer=$1 port=$2
  shift 2
  case $peer in
    sglang-router)
      "$PEER_VENV/bin/python" -m sglang_router.launch_router --host 127.0.0.1 \
        --port "$port" --worker-urls "$@" --policy cache_aware \
        --prometheus-host 127.0.0.1 --prometheus-port 29000 >"$LOGS/$peer.log" 2>&1 & ;;
    vllm-router)
      "$PEER_VENV/bin/vllm-router" --host 127.0.0.1 --port "$port" \
        --worker-urls "$@" --policy cache_aware \
        --prometheus-port 29010 >"$LOGS/$peer.log" 2>&1 & ;;
    *) echo "unknown peer $peer (sglang-router, vllm-router)" >&2; return 2 ;;
  esac
  PIDS+=($!)
}

stop_all() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
