#!/usr/bin/env bash
# The one set-up-and-test command (README): installs what the tests need on a fresh Debian
# machine, then runs every test tier CI can run: formatting, unused dependencies, lints, unit,
# component (real sockets), e2e against a real kube-apiserver, and the benchmark smoke test.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
JOBS=${JOBS:-2}
t0=$(date +%s)
step() { echo; echo "=== $* ($(( $(date +%s) - t0 )) s)"; }

step "set-up: Kubernetes API server binaries and etcd (cached in /opt/k8s-e2e/bin), Prometheus"
bash e2e/k8s/setup.sh

step "format"
cargo fmt --all -- --check

step "unused dependencies (cargo-machete)"
# Pinned so a new release cannot change what CI reports. One manifest per workspace member
# (*/Cargo.toml): the fuzz crates and bench/dynamo-compare live outside the workspace and are
# not built here. False positives are listed, with a reason, under
# [package.metadata.cargo-machete] in the crate's Cargo.toml.
MACHETE_VERSION=0.9.2
if [ "$(cargo machete --version 2>/dev/null)" != "$MACHETE_VERSION" ]; then
    cargo install --locked "cargo-machete@$MACHETE_VERSION" -j"$JOBS"
fi
cargo machete --skip-target-dir */Cargo.toml

step "supply chain (cargo-deny: licences, bans, sources)"
# Pinned like cargo-machete; policy and its reasons in deny.toml. A fresh install builds from
# crates.io: 225 s of CPU (2026-12-01), so about 2-3 minutes on two idle cores. Advisories
# are left out: the RustSec database is a git repository that no registry these machines
# reach ships, so it cannot be had offline (docs/security.md, "Supply chain").
DENY_VERSION=0.20.2
if [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $DENY_VERSION" ]; then
    cargo install --locked "cargo-deny@$DENY_VERSION" -j"$JOBS"
fi
cargo fetch --locked  # cargo-deny reads every dependency's manifest; --offline below
cargo deny --locked --offline check --hide-inclusion-graph licenses bans sources

step "lints"
cargo clippy --workspace --all-targets -j"$JOBS" -- -D warnings

step "build"
cargo build --workspace --all-targets -j"$JOBS"

step "tests: unit, component, e2e"
cargo test --workspace -j"$JOBS" -- --test-threads="${TEST_THREADS:-2}"

step "done"
