#!/usr/bin/env bash
# The Kubernetes e2e tier in one command: set-up (once per machine), the `kvroute` binary the
# tests start, then every e2e/tests/k8s_*.rs test binary (each starts its own API server).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
bash e2e/k8s/setup.sh
cargo build -p kvroute-cli -j2
tests=()
for f in e2e/tests/k8s_*.rs; do tests+=(--test "$(basename "$f" .rs)"); done
cargo test -p kvroute-e2e -j2 "${tests[@]}" "$@"
