#!/usr/bin/env bash
# The Kubernetes e2e scenario on kind, with real kubelets and real images (needs Docker, kind
# and kubectl; cannot run on the machines without a Docker engine: see README.md).
#   e2e/kind/run.sh            create cluster `kvroute-e2e`, build + load images, run, keep cluster
#   KEEP=0 e2e/kind/run.sh     ... and delete the cluster at the end
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/e2e/kind
CLUSTER=${KIND_CLUSTER:-kvroute-e2e}
TAG=${TAG:-0.1.0}
NS=kvroute-e2e
for tool in docker kind kubectl curl; do
  command -v "$tool" >/dev/null || { echo "$tool is required (see e2e/kind/README.md)" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "no Docker engine reachable" >&2; exit 1; }

step() { printf '\n== %s\n' "$*"; }
wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...
  local t=$1 what=$2; shift 2
  for _ in $(seq "$t"); do if "$@" >/dev/null 2>&1; then echo "ok: $what"; return 0; fi; sleep 1; done
  echo "FAILED: $what (after ${t}s)" >&2; exit 1
}
generation() { kubectl -n "$1" get deploy "$2" -o jsonpath='{.metadata.generation}'; }
# rolled NS DEPLOY MIN_GENERATION: the Deployment's controller has seen generation >= MIN (so a
# spec change the operator has just written is not mistaken for the previous, finished rollout,
# the race of a bare `kubectl rollout status`), and every replica is updated and available.
rolled() {
  local g o want up av
  # '|' keeps absent status fields (0 replicas) as empty fields instead of shifting the rest.
  IFS='|' read -r g o want up av < <(kubectl -n "$1" get deploy "$2" -o \
    jsonpath='{.metadata.generation}|{.status.observedGeneration}|{.spec.replicas}|{.status.updatedReplicas}|{.status.availableReplicas}{"\n"}')
  [ "${g:-0}" -ge "$3" ] && [ "${o:-0}" -ge "$g" ] && [ "${up:-0}" = "$want" ] && [ "${av:-0}" = "$want" ]
}
wait_rolled() {  # wait_rolled SECONDS NS DEPLOY [MIN_GENERATION]
  wait_until "$1" "deploy/$3 rolled out (generation >= ${4:-1} observed)" rolled "$2" "$3" "${4:-1}"
}

step "cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s
kubectl config use-context "kind-$CLUSTER" >/dev/null
[ "${KEEP:-1}" = 0 ] && trap 'kind delete cluster --name "$CLUSTER"' EXIT

step "images"
docker build -f "$HERE/Dockerfile" -t "kvroute:$TAG" "$ROOT"
for c in operator router sidecar mock-vllm; do
  docker tag "kvroute:$TAG" "ghcr.io/kvroute/kvroute-$c:$TAG"
  kind load docker-image --name "$CLUSTER" "ghcr.io/kvroute/kvroute-$c:$TAG"
done

step "CRDs and operator"
kubectl apply -f "$ROOT/crds/"
kubectl wait --for=condition=Established crd --all --timeout=60s
kubectl apply -f "$HERE/operator.yaml" -f "$ROOT/deploy/rbac.yaml"
wait_until 60 "Deployment kvroute-operator" kubectl -n kvroute-system get deploy kvroute-operator
wait_rolled 180 kvroute-system kvroute-operator
wait_until 60 "one operator replica holds the lease" \
  sh -c "kubectl -n kvroute-system get lease kvroute-operator -o jsonpath='{.spec.holderIdentity}' | grep -q kvroute-operator"

step "mock WorkerSet: Deployment, headless Service with sidecars, Ready"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f "$HERE/workerset.yaml"
wait_until 60 "Deployment mock" kubectl -n "$NS" get deploy mock
kubectl -n "$NS" get deploy mock -o jsonpath='{.spec.template.spec.containers[*].name}' | grep -qw sidecar
[ "$(kubectl -n "$NS" get svc mock -o jsonpath='{.spec.clusterIP}')" = None ]
kubectl -n "$NS" wait --for=condition=Ready iws/mock --timeout=300s
kubectl -n "$NS" get iws mock -o jsonpath='{.status.readyReplicas}' | grep -qx 2

step "a request through the operator's router"
# The router's readiness probe is its /readyz (discovery synced, tokenizers loaded, a worker's
# sidecar streaming to it), so rolled out = ready to route.
wait_until 120 "Deployment kvroute-router" kubectl -n kvroute-system get deploy kvroute-router
wait_rolled 300 kvroute-system kvroute-router
PF_PORT=${PF_PORT:-18080}
kubectl -n kvroute-system port-forward svc/kvroute-router "$PF_PORT:8080" >/dev/null 2>&1 &
PF=$!
trap 'kill $PF 2>/dev/null || true' EXIT
[ "${KEEP:-1}" = 0 ] && trap 'kill $PF 2>/dev/null || true; kind delete cluster --name "$CLUSTER"' EXIT
chat() {
  curl -sf --max-time 20 "http://127.0.0.1:$PF_PORT/v1/chat/completions" \
    -H 'content-type: application/json' \
    -d '{"model": "qwen3", "max_tokens": 8, "messages": [{"role": "user", "content": "Hello from kind"}]}'
}
wait_until 60 "the router answers a chat completion" chat
reply=$(chat)
echo "$reply" | grep -q '"choices"' || { echo "FAILED: no choices in $reply" >&2; exit 1; }
echo "ok: routed: $(echo "$reply" | head -c 200)"
kill $PF 2>/dev/null || true

step "GPU WorkerSet: resources, node selector, vLLM flags (pods stay Pending without GPU nodes)"
cat <<YAML | kubectl apply -f -
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: gpu, namespace: $NS}
spec: {model: {name: Qwen/Qwen3-8B}, replicas: 1, blockSize: 32, gpu: {count: 1}}
YAML
wait_until 60 "Deployment gpu" kubectl -n "$NS" get deploy gpu
kubectl -n "$NS" get deploy gpu -o jsonpath='{.spec.template.spec.containers[0].resources.limits.nvidia\.com/gpu}' | grep -qx 1
kubectl -n "$NS" get deploy gpu -o jsonpath='{.spec.template.spec.nodeSelector.nvidia\.com/gpu\.product}' | grep -qx NVIDIA-L40S
kubectl -n "$NS" get deploy gpu -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q -- --enable-prefix-caching
kubectl -n "$NS" get deploy gpu -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q -- --kv-events-config

step "scale and spec change"
kubectl -n "$NS" scale iws/mock --replicas=3
wait_until 300 "3 ready workers" sh -c "kubectl -n $NS get iws mock -o jsonpath='{.status.readyReplicas}' | grep -qx 3"
old=$(kubectl -n "$NS" get rs -l kvroute.dev/workerset=mock -o jsonpath='{.items[?(@.spec.replicas>0)].metadata.labels.pod-template-hash}')
before=$(generation "$NS" mock)
kubectl -n "$NS" patch iws mock --type=merge -p '{"spec":{"blockSize":32}}'
# The operator rewrites the Deployment after the patch: wait for that new generation, observed.
wait_until 60 "the operator updated deploy/mock" sh -c "[ \"\$(kubectl -n $NS get deploy mock -o jsonpath='{.metadata.generation}')\" -gt $before ]"
wait_rolled 300 "$NS" mock "$((before + 1))"
new=$(kubectl -n "$NS" get rs -l kvroute.dev/workerset=mock -o jsonpath='{.items[?(@.spec.replicas>0)].metadata.labels.pod-template-hash}')
[ "$old" != "$new" ] || { echo "FAILED: pods did not roll" >&2; exit 1; }
echo "ok: pods rolled ($old -> $new)"

step "bad specs become conditions"
cat <<YAML | kubectl apply -f -
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: bad-gpu, namespace: $NS}
spec: {model: {name: m}, gpu: {product: NVIDIA-RTX-9999}}
YAML
wait_until 60 "bad-gpu condition names the product" \
  sh -c "kubectl -n $NS get iws bad-gpu -o jsonpath='{.status.conditions[*].message}' | grep -q NVIDIA-RTX-9999"

step "leader failover"
leader=$(kubectl -n kvroute-system get lease kvroute-operator -o jsonpath='{.spec.holderIdentity}')
kubectl -n kvroute-system delete pod "$leader" --wait=false
wait_until 120 "another replica took the lease" \
  sh -c "kubectl -n kvroute-system get lease kvroute-operator -o jsonpath='{.spec.holderIdentity}' | grep -qv '^$leader\$'"

step "delete: children are garbage-collected"
kubectl -n "$NS" delete iws mock gpu bad-gpu
wait_until 120 "Deployment and Service mock gone" sh -c "! kubectl -n $NS get deploy mock && ! kubectl -n $NS get svc mock"

step "PASS"
