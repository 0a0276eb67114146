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

# The ARM64 kernels are checked on x86 machines too, cross-compiled and run under qemu's user-mode
# emulation (tests/test_arm_emulated.py, which skips without these tools): where this runs as root
# with apt (CI's containers), it installs them; anywhere else, or if apt fails, setup goes on.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    && ! { command -v qemu-aarch64 && command -v aarch64-linux-gnu-gcc; } >/dev/null 2>&1; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross; } >/dev/null 2>&1 \
        || echo "setup.sh: qemu-user and gcc-aarch64-linux-gnu not installed: the ARM64 emulation tests will skip" >&2
fi
