#!/usr/bin/env bash
# kvroute with and without the overcommit rule (`CoreConfig::overcommit_margin_tokens`):
# scripts/sim-compare.sh with `--overcommit-margin` (bench/README.md, "Overcommitted workers").
#
#   scripts/overcommit-compare.sh OUT [MARGIN...]     (default: off default)
set -euo pipefail
out=${1:?usage: overcommit-compare.sh OUT [MARGIN...]}
shift
[ $# -gt 0 ] || set -- off default
exec "$(dirname "$0")/sim-compare.sh" "$out" --overcommit-margin "$@"
