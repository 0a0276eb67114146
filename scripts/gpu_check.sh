#!/usr/bin/env bash
# The GPU kit's one command (docs/gpu.md).
#
# On the GPU machine, through the device tool:  run(command="bash scripts/gpu_check.sh", carry=[".whl"],
# timeout_s=480). In 7 minutes at most (GPU_KIT_BUDGET_S=420), each stage under its own cap, headline numbers
# first, it runs `python -m scripts.gpu_kit device-run`:
#   install      the carried wheels (.whl/, scripts/gpu_wheels.sh) into /tmp/gpu-kit, the prebuilt flashinfer
#                modules (.whl/flashinfer-aot.tar.xz, `gpu_kit aot`) into it; then in the background the
#                random-weight pair, tvm-ffi's torch add-on and the env report
#   preflight    a pinned round trip, a CUDA graph on a side stream, import flashinfer, a -lcuda link, the toolkit
#   kernels      the page append and FA2 loaded, each from AOT or (fallback) the JIT
#   decode       one decode step per model at B = 1, 16, 64: graph replay, eager, HF with SDPA, the memory floor
#   routed       C = 16, 64, 1, each level through routed, standard+pc, lockstep, large (prefill FA2)
#   tests        pytest -m gpu tests/engine/attention/test_gpu_backend.py (prefill FA2)
#   single       the engine against HF generate on the large model
#   eager        routed with CUDA graphs off, C = 16
#   kernels-fa3  FA3 loaded (AOT), then fa3: routed at C = 16 with prefill on FA3; report: the modules built
# Every stage writes $OUT/<stage>.json as it ends; $OUT/summary.json is rewritten at every start and end, and
# its `cut` names what did not finish; the bench results go to $OUT/bench/ as each run ends; gpu_check.log
# has everything printed, and a compact table ends it.
#
# Here, on a CPU machine:  bash scripts/gpu_check.sh --dry-run [--without-wheels]
# checks everything short of the GPU: every requirement met by the machine or the pins (offline), the wheel
# set (RECORDs, pins, recorded Requires-Dist, pip's resolver offline against the machine's packages, the very
# install command), the trimmed flashinfer (imports, our kernels' JIT sources and #include closure), the AOT
# modules (NEEDED, GLIBC, exports, names), the size of what travels, the length of the run command, and that
# every stage starts (a CPU smoke of each, and a simulated device run on a fake clock).
# --without-wheels skips what needs .whl/.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUN_COMMAND="bash scripts/gpu_check.sh"  # what docs/gpu.md tells the device tool to run, with carry [".whl"]
CARRY=".whl"
DRY=0
WITHOUT_WHEELS=0
for a in "$@"; do
    case $a in
        --dry-run) DRY=1 ;;
        --without-wheels) WITHOUT_WHEELS=1 ;;
        --print-command) echo "$RUN_COMMAND"; exit 0 ;;
        -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $a (--dry-run, --without-wheels, --print-command)"; exit 2 ;;
    esac
done
# tvm-ffi goes with the base wheels: xgrammar (a core dependency) imports it too, with or without flashinfer
BASE_WHEELS() { ls .whl/*.whl | grep -v -e '/flashinfer_python-'; }
FI_WHEELS() { ls .whl/flashinfer_python-*.whl; }

# ---- the dry run, on CPU ------------------------------------------------------------------------------
if [ "$DRY" = 1 ]; then
    PY=${PYTHON:-.venv/bin/python}
    [ -x "$PY" ] || PY=python3
    export PIP_CONFIG_FILE=/dev/null  # no index, no mirror: every pip call here is offline
    TMP=$(mktemp -d /tmp/gpu-kit-dry.XXXXXX)
    trap 'rm -rf "$TMP"' EXIT
    FAILED=()
    check() {  # name cmd...: run, say PASS or FAIL with the time
        local name=$1 t0=$SECONDS
        shift
        echo "== $name"
        if "$@"; then
            echo "PASS $name ($((SECONDS - t0)) s)"
        else
            echo "FAIL $name ($((SECONDS - t0)) s)"
            FAILED+=("$name")
        fi
    }
    install_like_gpu() {  # the install stage's commands, for the GPU machine's Python and platform
        local tags=(--python-version 3.12 --implementation cp --abi cp312 --only-binary=:all:
                    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
                    --platform manylinux2014_x86_64)
        "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade "${tags[@]}" --target "$TMP/site" $(BASE_WHEELS) &&
        "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade "${tags[@]}" --target "$TMP/site-fi" $(FI_WHEELS) &&
        ls "$TMP/site-fi/flashinfer/__init__.py" "$TMP/site/pydantic/__init__.py" "$TMP/site/xgrammar/__init__.py" \
            "$TMP/site/tvm_ffi/__init__.py" > /dev/null && [ ! -e "$TMP/site-fi/tvm_ffi" ] &&
        { [ ! -f .whl/tokenizer.tar.xz ] || { mkdir -p "$TMP/tokenizer" && tar -xJf .whl/tokenizer.tar.xz -C "$TMP/tokenizer" && ls "$TMP/tokenizer/tokenizer.json" > /dev/null; }; }
    }
    command_fits() {
        local n=${#RUN_COMMAND}
        echo "run command: '$RUN_COMMAND' ($n characters of 2000), carry [\"$CARRY\"], timeout_s 480"
        [ "$n" -le 2000 ] && grep -qF "command=\"$RUN_COMMAND\"" docs/gpu.md &&
            grep -qF "carry=[\"$CARRY\"]" docs/gpu.md || { echo "docs/gpu.md does not show this run call"; return 1; }
    }
    env_stage_starts() {  # check-env runs and reports (here it finds problems: no GPU, not the machine's packages)
        local site="" wheels=.whl
        [ "$WITHOUT_WHEELS" = 1 ] && wheels="$TMP/none" || site="$TMP/site:$TMP/site-fi:"
        PYTHONPATH="$ROOT:$site" "$PY" -m scripts.gpu_kit check-env --wheels "$wheels" --json "$TMP/env.json" \
            > "$TMP/env.log" 2>&1
        "$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); print(f'check-env ran: {len(r)} fields,', len(r['problems']), 'problems on this CPU machine (no GPU; the resolver check stands for the machine')" "$TMP/env.json" ||
            { tail -20 "$TMP/env.log"; return 1; }
    }
    tests_stage_starts() {
        local out
        out=$("$PY" -m pytest -m gpu --collect-only -q -p no:cacheprovider tests/engine/attention/test_gpu_backend.py 2>&1)
        echo "$out" | tail -1
        echo "$out" | tail -1 | grep -qE "^[1-9][0-9]*(/[0-9]+)? tests? collected" && ! echo "$out" | tail -1 | grep -qi "error" ||
            { echo "$out" | tail -20; return 1; }
    }
    bench_stages_start() {  # the same bench_gpu.py --quick commands, on a tiny random pair on CPU
        "$PY" benchmarks/engine/bench_gpu.py --random-weights --tiny --quick --device cpu --dtype float32 --batch 1 2 \
            --concurrency 1 --max-tokens 2 --step-timeout 300 --out "$TMP/bench" > "$TMP/bench.log" 2>&1
        local rc=$?
        grep "^# .*: exit" "$TMP/bench.log"
        [ $rc = 0 ] && ls "$TMP/bench/"{decode,routed,single,routed-eager,routed-fa3}.json > /dev/null ||
            { tail -30 "$TMP/bench.log"; return 1; }
        "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); s={x['system'] for x in r['summaries']}; print('routed step systems:', sorted(s)); sys.exit(s != {'routed','lockstep','standard+pc','large'})" "$TMP/bench/routed.json"
    }
    preflight_stage_starts() {  # on CPU the CUDA parts fail (exit 1); with the wheels, flashinfer imports
        local site="" want="[12]"  # without them, flashinfer imports only where this interpreter has one
        [ "$WITHOUT_WHEELS" = 1 ] || { site=".whl-host/site:$TMP/site-fi:"; want=1; }
        PYTHONPATH="$site$ROOT" TVM_FFI_DISABLE_TORCH_C_DLPACK=1 CUDA_VISIBLE_DEVICES="" timeout 60 \
            "$PY" -m scripts.gpu_kit preflight --json "$TMP/preflight.json" > "$TMP/preflight.log" 2>&1
        local rc=$?
        grep '^preflight ' "$TMP/preflight.log" | cut -c1-160
        [[ $rc == $want ]] && "$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); sys.exit(sorted(r) != ['flashinfer', 'graph', 'pinned', 'rc', 'toolkit'])" "$TMP/preflight.json" ||
            { echo "preflight exited $rc, not $want"; tail -20 "$TMP/preflight.log"; return 1; }
    }
    prefill_flag() {  # where FA3 fails, the bench stages get --prefill-backend fa2
        "$PY" benchmarks/engine/bench_gpu.py --help 2>&1 | grep -q -- "--prefill-backend" ||
            { echo "benchmarks/engine/bench_gpu.py has no --prefill-backend: the bench stages would fail where FA3 did"; return 1; }
    }
    device_run_simulated() {  # the device run itself, every stage simulated, on a fake clock: JSON per stage, summary
        OUT="$TMP/device-out" GPU_KIT_WORK="$TMP/device-work" GPU_KIT_FAKE_CLOCK=1 GPU_KIT_SIMULATE="kernels-fa3=0" \
            "$PY" -m scripts.gpu_kit device-run > "$TMP/device-run.log" 2>&1 || { tail -20 "$TMP/device-run.log"; return 1; }
        "$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['finished'] and not s['cut'], s['cut']; import os; assert all(os.path.isfile(f\"{sys.argv[2]}/{x['stage']}.json\") for x in s['stages']); print(len(s['stages']), 'stages finished, each with its JSON')" "$TMP/device-out/summary.json" "$TMP/device-out"
    }
    check "complete: every requirement met by the GPU machine's packages or the kit's pins (offline)" \
        "$PY" -m scripts.gpu_kit complete
    if [ "$WITHOUT_WHEELS" = 0 ]; then
        if ! ls .whl/*.whl > /dev/null 2>&1 || [ ! -d .whl-host/site ]; then
            echo "FAIL: no .whl/ or .whl-host/: run 'bash scripts/gpu_wheels.sh' first (needs PyPI), or pass --without-wheels"
            exit 1
        fi
        check "wheels: pinned, one version each, RECORD and the recorded Requires-Dist match" "$PY" -m scripts.gpu_kit verify-wheels .whl
        check "requirements: pip's resolver, offline, against the GPU machine's packages" "$PY" -m scripts.gpu_kit resolve .whl
        check "stage install: the same pip commands, Python 3.12 manylinux tags" install_like_gpu
        check "flashinfer: the trimmed copy imports, our kernels' JIT sources generate, their #includes resolve" \
            "$PY" -m scripts.gpu_kit check-trimmed "$TMP/site-fi" --host-site .whl-host/site
        check "aot: the prebuilt modules' NEEDED, GLIBC, exports, and names against the engine's" \
            "$PY" -m scripts.gpu_kit check-aot --wheels .whl --site "$TMP/site-fi" --host-site .whl-host/site
        check "size: what travels" "$PY" -m scripts.gpu_kit travel-size --carry "$CARRY"
    else
        echo "== --without-wheels: skipping the wheel set, the install, the trimmed flashinfer"
        check "size: what travels (the working tree alone; .whl/ not built)" "$PY" -m scripts.gpu_kit travel-size --carry
    fi
    check "command: the device run call fits and docs/gpu.md shows it" command_fits
    check "stage preflight starts: pinned memory, a graph on a side stream, import flashinfer" preflight_stage_starts
    check "stage env starts" env_stage_starts
    check "stage tests starts: the gpu tests collect" tests_stage_starts
    check "stages decode, routed, single, eager, fa3 start: bench_gpu.py --quick on a tiny pair on CPU" bench_stages_start
    check "stages with prefill forced to FA2: bench_gpu.py takes --prefill-backend" prefill_flag
    check "device run: simulated on a fake clock, every stage's JSON and the summary" device_run_simulated
    if [ ${#FAILED[@]} -gt 0 ]; then
        echo "dry run: ${#FAILED[@]} check(s) failed: ${FAILED[*]}"
        exit 1
    fi
    echo "dry run: every check passed"
    exit 0
fi

# ---- on the GPU machine -------------------------------------------------------------------------------
# The stages, their order, caps and fallbacks live in scripts/gpu_kit/device_run.py (docs/gpu.md has the table).
exec "${GPU_KIT_PYTHON:-python3}" -m scripts.gpu_kit device-run
