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
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "$tool is required (see e2e/kind/README.md)" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "no Docker engine reachable" >&2; exit 1; }

step() { printf '\n== %s\n' "$*"; }
wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...
  local t=$1 what=$2; shift 2
  for _ in $(seq "$t"); do if "$@" >/dev/null 2>&1; then echo "ok: $what"; return 0; fi; sleep 1; done
  echo "FAILED: $what (after ${t}s)" >&2; exit 1
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
kubectl apply -f "$HERE/operator.yaml"
kubectl -n kvroute-system rollout status deploy/kvroute-operator --timeout=180s
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
kubectl -n "$NS" patch iws mock --type=merge -p '{"spec":{"blockSize":32}}'
kubectl -n "$NS" rollout status deploy/mock --timeout=300s
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
