#!/usr/bin/env bash
# Builds the four kvroute images from bundle/images/*.Dockerfile without Docker and without
# pulling from any registry: Debian's buildah (rootful, `--isolation chroot`: no OCI runtime,
# no cgroups) on base images made here by debootstrap, in a private image store under $STATE.
# Opt-in: nothing runs it automatically.
#
#   apt-get install -y buildah debootstrap
#   e2e/images/build.sh                                    # ghcr.io/kvroute/kvroute-<c>:0.1.0
#   REGISTRY=registry.example.com/ai PUSH=1 e2e/images/build.sh   # ... and push (private registry)
#   ARCHIVE=1 e2e/images/build.sh                          # ... and write $STATE/<c>.tar for
#                                                          #     `kind load image-archive`
#   COMPONENTS="router sidecar" e2e/images/build.sh        # only some
#
# Needs root (debootstrap; buildah's chroot isolation), a Debian mirror (MIRROR) and crates.io
# (or the cargo mirror your ~/.cargo/config.toml names; the build stage runs `cargo build
# --locked` with the host network) reachable, a Rust toolchain on this machine, and ~8 GB
# under STATE.
#
# Base images. The Dockerfiles start FROM rust:1.95-bookworm (build stage) and
# gcr.io/distroless/cc-debian12:nonroot (runtime). This script makes stand-ins under exactly
# those names in its own store (`buildah --root $STATE/storage`; your other images are not
# touched) from a debootstrap of Debian bookworm: the builder is bookworm + build-essential +
# this machine's Rust toolchain (`rustc --print sysroot`); the runtime is a bookworm minbase
# (libc, libgcc, ca-certificates) with the distroless `nonroot` user 65532. `--pull=never` makes
# every FROM resolve to them, so the Dockerfiles build unchanged and no registry is contacted.
#
# What happened on the project's build machine (2026-12-01; a Debian 12 container, root, 2
# shared cores): `apt-get install -y podman buildah debootstrap` works (podman 4.3.1, buildah
# 1.28.2). No container can be started the Docker way there:
#   $ podman run --rm IMAGE ...
#   Error: crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied
#   $ podman run --rm --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 IMAGE ...
#   Error: OCI runtime error: crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2
# (`--cgroups disabled` gives the same). `buildah bud --isolation chroot` does run RUN steps
# there (checked with a two-line Containerfile on an imported rootfs), which is why this script
# uses it. The full build was not run there: the shared disk had under 500 MB free, and a release
# build of four binaries on two shared cores was out of reach.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STATE=${STATE:-$ROOT/.e2e-state/images}
REGISTRY=${REGISTRY:-ghcr.io/kvroute}
TAG=${TAG:-0.1.0}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
COMPONENTS=${COMPONENTS:-operator router sidecar mock-vllm}
STORAGE_DRIVER=${STORAGE_DRIVER:-overlay}
BUILDER_IMAGE=docker.io/library/rust:1.95-bookworm
RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap and buildah's chroot isolation)" >&2; exit 1; }
for tool in buildah debootstrap git rustc tar; do
  command -v "$tool" >/dev/null || { echo "$tool is required (apt-get install -y buildah debootstrap)" >&2; exit 1; }
done
mkdir -p "$STATE"
b() { buildah --root "$STATE/storage" --runroot "$STATE/run" --storage-driver "$STORAGE_DRIVER" "$@"; }
have() { b inspect --type image "$1" >/dev/null 2>&1; }
step() { printf '\n== %s\n' "$*"; }

# rootfs DIR DEBOOTSTRAP_ARGS...: a debootstrap of $SUITE into DIR, made once.
rootfs() {
  local dir=$1; shift
  [ -e "$dir.done" ] && return 0
  rm -rf "$dir"
  debootstrap --variant=minbase "$@" "$SUITE" "$dir" "$MIRROR"
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  touch "$dir.done"
}

# image NAME ROOTFS: a single-layer image of ROOTFS (then configured by the caller).
image_from() {
  local c
  c=$(b from scratch)
  b copy "$c" "$2" / >/dev/null
  echo "$c"
}

if ! have "$RUNTIME_IMAGE"; then
  step "runtime base ($RUNTIME_IMAGE stand-in): debootstrap $SUITE minbase"
  rootfs "$STATE/rootfs-runtime" --include=ca-certificates
  # distroless's nonroot user.
  grep -q '^nonroot:' "$STATE/rootfs-runtime/etc/passwd" || {
    echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >> "$STATE/rootfs-runtime/etc/passwd"
    echo 'nonroot:x:65532:' >> "$STATE/rootfs-runtime/etc/group"
    install -d -o 65532 -g 65532 "$STATE/rootfs-runtime/home/nonroot"
  }
  c=$(image_from runtime "$STATE/rootfs-runtime")
  b config --user 65532:65532 --workingdir /home/nonroot "$c"
  b commit --rm "$c" "$RUNTIME_IMAGE"
fi

if ! have "$BUILDER_IMAGE"; then
  sysroot=$(rustc --print sysroot)
  step "builder base ($BUILDER_IMAGE stand-in): debootstrap $SUITE + build-essential + $(rustc --version)"
  case "$(rustc --version)" in
    "rustc 1.95"*) ;;
    *) echo "note: the Dockerfiles name Rust 1.95; this builder carries $(rustc --version)" >&2 ;;
  esac
  rootfs "$STATE/rootfs-builder" --include=ca-certificates,build-essential,pkg-config
  c=$(image_from builder "$STATE/rootfs-builder")
  b copy "$c" "$sysroot" /usr/local/rust >/dev/null
  # As in the official rust image: CARGO_HOME=/usr/local/cargo (the Dockerfiles cache its registry).
  b config --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "$c"
  b commit --rm "$c" "$BUILDER_IMAGE"
fi

step "build context: the working tree's tracked and unignored files (no target/)"
ctx=$STATE/context
rm -rf "$ctx" && mkdir -p "$ctx"
git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
  | tar -C "$ROOT" --null --ignore-failed-read -T - -cf - | tar -C "$ctx" -xf -

for c in $COMPONENTS; do
  img=$REGISTRY/kvroute-$c:$TAG
  step "$img"
  b bud --isolation chroot --pull=never --layers \
    -f "$ctx/bundle/images/$c.Dockerfile" -t "$img" "$ctx"
  if [ "${ARCHIVE:-0}" = 1 ]; then
    rm -f "$STATE/$c.tar"
    b push "$img" "docker-archive:$STATE/$c.tar:$img"
    echo "wrote $STATE/$c.tar (kind load image-archive $STATE/$c.tar)"
  fi
  if [ "${PUSH:-0}" = 1 ]; then
    b push "$img" "docker://$img"
  fi
done

step "images"
b images
