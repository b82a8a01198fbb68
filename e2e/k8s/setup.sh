#!/usr/bin/env bash
# One-time set-up of the Kubernetes e2e tier on a Debian bookworm machine (CI runs it first).
# Idempotent: installs etcd/openssl/curl and prometheus (for e2e/tests/prometheus.rs) from apt
# when missing and builds kube-apiserver + kube-controller-manager v1.20.2 from Debian's
# source package once, into $K8S_BIN
# (default /opt/k8s-e2e/bin). A second run only checks and prints what it found.
# The e2e tests (cargo test -p kvroute-e2e --test 'k8s_*') read $KVROUTE_K8S_BIN or /opt/k8s-e2e/bin.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export K8S_BIN=${KVROUTE_K8S_BIN:-${K8S_BIN:-/opt/k8s-e2e/bin}}
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo

need_apt=
for c in etcd openssl curl; do command -v "$c" >/dev/null || need_apt=1; done
if [ -n "$need_apt" ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends etcd-server openssl curl ca-certificates >/dev/null
fi

# The dashboards test (e2e/tests/prometheus.rs) runs Debian's Prometheus and promtool on a
# loopback port of its own; the packaged service is not needed, so it is stopped if it started.
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if command -v systemctl >/dev/null; then $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
fi
prometheus --version 2>&1 | sed -n 1p   # sed reads all: no SIGPIPE under pipefail

if [ -x "$K8S_BIN/kube-apiserver" ] && [ -x "$K8S_BIN/kube-controller-manager" ]; then
  echo "k8s e2e binaries present in $K8S_BIN"
else
  # another set-up may be building right now (the build takes 6-10 minutes): wait for it
  exec 9>"${TMPDIR:-/tmp}/kvroute-k8s-setup.lock"
  flock 9
  if [ -x "$K8S_BIN/kube-apiserver" ] && [ -x "$K8S_BIN/kube-controller-manager" ]; then
    echo "k8s e2e binaries present in $K8S_BIN (built by a concurrent set-up)"
  else
    echo "building kube-apiserver + kube-controller-manager into $K8S_BIN (once per machine, ~6-10 min)"
    $SUDO env K8S_BIN="$K8S_BIN" bash "$HERE/build-kube-apiserver.sh"
  fi
fi
bash "$HERE/install-helm.sh"   # helm for the chart test (operator/tests/helm.rs)
"$K8S_BIN/kube-apiserver" --version
etcd --version | sed -n 1p
