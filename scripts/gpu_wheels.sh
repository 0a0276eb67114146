#!/usr/bin/env bash
# Fill .whl/ with everything the GPU machine lacks, for scripts/gpu_check.sh (docs/gpu.md). Run on a CPU
# machine that reaches PyPI, from anywhere in the repository:
#
#   bash scripts/gpu_wheels.sh
#
# 1. downloads the wheels pinned in scripts/gpu_wheels.txt for Python 3.12 manylinux x86_64, checking
#    each file's sha256 (pip --require-hashes);
# 2. installs the host helpers of the CPU-side probe into .whl-host/ (apache-tvm-ffi and nvidia-ml-py
#    for THIS interpreter; they never travel);
# 3. repacks flashinfer-python as 0.7.4+trim (python -m scripts.gpu_kit trim): every Python file and header
#    tree, only the CUDA sources our kernels' JIT reaches, a fresh RECORD;
# 4. packs the demo pair's tokenizer from the store into .whl/tokenizer.tar.xz when the store has it
#    (bench_gpu.py --random-weights then runs the real vocabulary; without it, a small one);
# 5. copies the prebuilt flashinfer modules into .whl/ where `python -m scripts.gpu_kit aot` cached a build for this
#    wheel (else run that once, ~30 min);
# 6. checks the set (RECORDs, pins, and that scripts/gpu_wheels_requires.txt, which the offline completeness
#    test reads, records each wheel's Requires-Dist: `python -m scripts.gpu_kit record-requires .whl` rewrites
#    it after a pin changes) and prints each wheel's size and the size of what travels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
TVM_FFI=$(sed -n 's/^\(apache-tvm-ffi==[^ ]*\) .*/\1/p' scripts/gpu_wheels.txt)
NVML=nvidia-ml-py==13.615.71  # the host helper for `import flashinfer` (pynvml); the machine has its own
DL=$(mktemp -d)
trap 'rm -rf "$DL"' EXIT

echo "== downloading the pinned wheels (Python 3.12, manylinux x86_64, sha256 checked)"
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    --require-hashes -r scripts/gpu_wheels.txt -d "$DL"

echo "== host helpers for the CPU probe ($TVM_FFI, $NVML for $("$PY" -c 'import sys; print(sys.version.split()[0])')) -> .whl-host/"
rm -rf .whl-host
"$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile --only-binary=:all: \
    --target .whl-host/site "$TVM_FFI" "$NVML"

echo "== trimming flashinfer-python"
rm -rf .whl
mkdir -p .whl
"$PY" -m scripts.gpu_kit trim "$DL"/flashinfer_python-*.whl .whl --host-site .whl-host/site
for w in "$DL"/*.whl; do
    case "$(basename "$w")" in flashinfer_python-*) ;; *) cp "$w" .whl/ ;; esac
done

STORE=${TOKENROUTER_HOME:-$HOME/.cache/tokenrouter}/models/qwen-coder-0.5b
if [ -f "$STORE/tokenizer.json" ]; then
    echo "== the demo pair's tokenizer from $STORE -> .whl/tokenizer.tar.xz"
    tar -C "$STORE" --sort=name --mtime=2020-01-01 --owner=0 --group=0 --numeric-owner \
        -cJf .whl/tokenizer.tar.xz tokenizer.json tokenizer_config.json chat_template.jinja
else
    echo "== no demo pair in the store ($STORE): bench_gpu.py will use a small tokenizer" \
         "(run 'tokenrouter pull qwen-coder-0.5b' first for the real vocabulary)"
fi

echo "== the prebuilt flashinfer modules (gpu_kit aot), if a build for this wheel is cached"
"$PY" -m scripts.gpu_kit aot --cached-only

echo "== checking the set"
"$PY" -m scripts.gpu_kit verify-wheels .whl
[ -f .whl/tokenizer.tar.xz ] && echo "  $(du -b .whl/tokenizer.tar.xz | awk '{printf "%8.2f MiB", $1/1048576}')  tokenizer.tar.xz"
"$PY" -m scripts.gpu_kit travel-size --carry .whl
