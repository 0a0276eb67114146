#!/usr/bin/env bash
# Set up .venv for tokenrouter: idempotent, quick when already done.
# On a machine without an NVIDIA GPU, torch is pinned to the CPU build (2.13.0) first, so that
# the `torch>=2.6` requirement does not pull a multi-GB CUDA build. With a GPU, pip picks torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==2.13.0"
    EXTRAS="test"
else
    EXTRAS="test,gpu"
fi
.venv/bin/pip install -q -e ".[${EXTRAS}]"
