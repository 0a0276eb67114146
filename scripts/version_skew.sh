#!/usr/bin/env bash
# The default test suite on CPU with the GPU machine's versions (scripts/gpu_machine.txt): torch 2.11.0
# and transformers 5.17.0, with the machine's `seen` accelerate, huggingface-hub, safetensors,
# tokenizers and numpy. It makes (or reuses) its own venv, .venv-skew/, and leaves .venv alone.
#
#   bash scripts/version_skew.sh [OUT_DIR] [-- PYTEST_ARGS...]
#
# OUT_DIR (default benchmarks/results/version-skew) receives versions.txt, pytest.log and
# pytest.xml (JUnit), with this checkout's path written as "." and $HOME as "~".
#
# torch 2.11.0 has no CPU build on PyPI: its Linux wheel there is the CUDA 13.0 build, which needs
# its nvidia-* and cuda-toolkit dependencies even to import (it links libcudnn.so.9; the venv is
# 5.3 GB), and the CPU index (download.pytorch.org/whl/cpu) is not reachable from every machine. So
# the venv gets PyPI's wheel with all its dependencies, likely the GPU machine's build too (its list
# has the same triton, 3.6.0, and nvidia-*-cu13 packages). Without an NVIDIA GPU it runs on the CPU:
# torch.cuda.is_available() is False and the `gpu` tests skip.
# SKEW_TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU build from there instead.
#
# numpy: the machine has 2.5.2, which has no wheel for Python 3.11; below 3.12 the newest 2.4 is used.
# Torch's threads are set as in every run of the suite: tests/conftest.py sets one.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
OUT="benchmarks/results/version-skew"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then OUT="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
VENV="${SKEW_VENV:-.venv-skew}"
PY="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PYV="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
    NUMPY="numpy==2.5.2"
else
    NUMPY="numpy>=2.4,<2.5"
fi
PINS=(
    "torch==2.11.0" "transformers==5.17.0" "accelerate==1.15.0" "huggingface-hub==1.33.0"
    "safetensors==0.8.0" "tokenizers==0.23.2" "$NUMPY"
)
INDEX=()
[ -n "${SKEW_TORCH_INDEX:-}" ] && INDEX=(--extra-index-url "$SKEW_TORCH_INDEX")
echo "== install into $VENV (Python $PYV): ${PINS[*]}"
"$VENV/bin/pip" install -q "${INDEX[@]}" -e ".[test]" "${PINS[@]}"

mkdir -p "$OUT"
strip_paths() { sed -e "s|$ROOT|.|g" -e "s|$HOME|~|g" "$@"; }
"$VENV/bin/python" - <<'EOF' | tee "$OUT/versions.txt"
import platform
import sys
from importlib.metadata import version

import torch

print("date", __import__("datetime").date.today().isoformat())
print("python", platform.python_version(), "on", platform.machine(), platform.system())
for name in ("torch", "transformers", "accelerate", "huggingface-hub", "safetensors", "tokenizers",
             "numpy", "xgrammar", "triton", "pytest"):
    try:
        print(name, version(name))
    except Exception as e:  # a missing one is printed, not fatal
        print(name, "missing:", type(e).__name__)
print("torch.version.cuda", torch.version.cuda, "| cuda available", torch.cuda.is_available())
print("cpu cores", __import__("os").cpu_count())
EOF

echo "== $VENV/bin/python -m pytest -p no:cacheprovider --junitxml $OUT/pytest.xml $*"
START=$(date +%s)
set +e
"$VENV/bin/python" -m pytest -p no:cacheprovider --junitxml "$OUT/pytest.xml" "$@" 2>&1 | tee "$OUT/pytest.raw.log"
RC=${PIPESTATUS[0]}
set -e
echo "== pytest exit $RC after $(( $(date +%s) - START )) s" | tee -a "$OUT/pytest.raw.log"
strip_paths "$OUT/pytest.raw.log" > "$OUT/pytest.log" && rm "$OUT/pytest.raw.log"
strip_paths -i -e 's|hostname="[^"]*"|hostname=""|' "$OUT/pytest.xml"
exit "$RC"
