#!/usr/bin/env bash
# The GPU kit's one command (docs/gpu.md).
#
# On the GPU machine, through the device tool:  run(command="bash scripts/gpu_check.sh", carry=[".whl"],
# timeout_s=600). In 8 minutes at most (GPU_KIT_BUDGET_S=480), each stage under its own cap, it
#   install   installs the carried wheels (.whl/, made by scripts/gpu_wheels.sh) into /tmp/gpu-kit
#   preflight within 30 s: a pinned allocation, a one-kernel CUDA graph on a side stream, import flashinfer
#   env       prints versions and the GPU, and checks every requirement is met
#   import    imports flashinfer (and tvm-ffi, which may build a small torch extension once)
#   jit-fa2   builds the page append and FA2 kernels (the random-weight pair is written meanwhile)
#   jit-fa3   builds the FA3 kernels (prefill rows over 64 tokens), MAX_JOBS nvcc jobs at once
#             one stage at a time degrades: if flashinfer fails the pre-flight, the import or jit-fa2, the
#             later stages run torch's attention backend on CUDA (flashinfer left off PYTHONPATH); if jit-fa3
#             fails or times out, flashinfer stays with prefill forced to FA2 (--prefill-backend fa2); `!!`
#             lines in the log and "fallbacks" in summary.json say so
#   tests     pytest -m gpu tests/engine/attention/test_gpu_backend.py
#   routed    bench_gpu.py --quick --steps routed: routed vs lockstep, standard+pc, the large model alone
#   eager     bench_gpu.py --quick --steps eager: routed with CUDA graphs off, C = 16
#   single    bench_gpu.py --quick --steps single: the engine vs HF generate on the large model
#   report    which flashinfer modules were built, and any the jit stages did not foresee
# and writes to $OUT (default ./gpu_out): gpu_check.log, summary.json (stage times, versions, results),
# pytest.xml, routed.json, single.json, routed-eager.json. Stage times are printed at the end.
#
# Here, on a CPU machine:  bash scripts/gpu_check.sh --dry-run [--without-wheels]
# checks everything short of the GPU: every requirement met by the machine or the pins (offline), the wheel
# set (RECORDs, pins, recorded Requires-Dist, pip's resolver offline against the machine's packages, the very
# install command), the trimmed flashinfer (imports, our kernels' JIT sources and #include closure), the size
# of what travels, the length of the run command, and that every stage starts (a CPU smoke of each).
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
        -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
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
        echo "run command: '$RUN_COMMAND' ($n characters of 2000), carry [\"$CARRY\"], timeout_s 600"
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
        "$PY" benchmarks/bench_gpu.py --random-weights --tiny --quick --device cpu --dtype float32 \
            --concurrency 1 --max-tokens 2 --step-timeout 300 --out "$TMP/bench" > "$TMP/bench.log" 2>&1
        local rc=$?
        grep "^# .*: exit" "$TMP/bench.log"
        [ $rc = 0 ] && ls "$TMP/bench/routed.json" "$TMP/bench/single.json" "$TMP/bench/routed-eager.json" > /dev/null ||
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
        [[ $rc == $want ]] && "$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); sys.exit(sorted(r) != ['flashinfer', 'graph', 'pinned', 'rc'])" "$TMP/preflight.json" ||
            { echo "preflight exited $rc, not $want"; tail -20 "$TMP/preflight.log"; return 1; }
    }
    prefill_flag() {  # where FA3 fails, the bench stages get --prefill-backend fa2
        "$PY" benchmarks/bench_gpu.py --help 2>&1 | grep -q -- "--prefill-backend" ||
            { echo "benchmarks/bench_gpu.py has no --prefill-backend: the bench stages would fail where FA3 did"; return 1; }
    }
    summary_stage_starts() {
        printf 'install\t90\t12.5\t0\t\njit\t300\t0\t-1\tskipped: no time left\n' > "$TMP/stages.tsv" &&
        "$PY" -m scripts.gpu_kit summary --out "$TMP" --stages "$TMP/stages.tsv" --attention flashinfer \
            --prefill-backend fa2 --fallback "prefill fa2: FA3 failed to build" > /dev/null &&
        "$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); assert [x['stage'] for x in s['stages']] == ['install', 'jit'] and s['prefill_backend'] == 'fa2'" "$TMP/summary.json"
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
        check "size: what travels" "$PY" -m scripts.gpu_kit travel-size --carry "$CARRY"
    else
        echo "== --without-wheels: skipping the wheel set, the install, the trimmed flashinfer"
        check "size: what travels (the working tree alone; .whl/ not built)" "$PY" -m scripts.gpu_kit travel-size --carry
    fi
    check "command: the device run call fits and docs/gpu.md shows it" command_fits
    check "stage preflight starts: pinned memory, a graph on a side stream, import flashinfer" preflight_stage_starts
    check "stage env starts" env_stage_starts
    check "stage tests starts: the gpu tests collect" tests_stage_starts
    check "stages routed, single, eager start: bench_gpu.py --quick on a tiny pair on CPU" bench_stages_start
    check "stages with prefill forced to FA2: bench_gpu.py takes --prefill-backend" prefill_flag
    check "stage summary starts" summary_stage_starts
    if [ ${#FAILED[@]} -gt 0 ]; then
        echo "dry run: ${#FAILED[@]} check(s) failed: ${FAILED[*]}"
        exit 1
    fi
    echo "dry run: every check passed"
    exit 0
fi

# ---- on the GPU machine -------------------------------------------------------------------------------
OUT=${OUT:-$ROOT/gpu_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
TEE=$!
BUDGET=${GPU_KIT_BUDGET_S:-480}
START=$SECONDS
WORK=${GPU_KIT_WORK:-/tmp/gpu-kit}
SITE=$WORK/site
FISITE=$WORK/site-fi
BENCH=$WORK/bench
STAGES=$WORK/stages.tsv
mkdir -p "$WORK" "$BENCH"
: > "$STAGES"
PY=${GPU_KIT_PYTHON:-python3}
# nvcc jobs at once: one a core, fewer if memory is short (an FA3 nvcc job peaks at 3.5 GiB; gpu_kit
# max-jobs allows 4 GiB each), and never more than a MAX_JOBS already set. flashinfer's JIT passes MAX_JOBS
# (FLASHINFER_JIT_PREBUILD_MAX_JOBS first, for a batch build) to ninja -j; FLASHINFER_NVCC_THREADS is each
# nvcc's --threads, kept at 1 so that a job is one compilation at a time.
JOBS=$($PY -m scripts.gpu_kit max-jobs 2> /dev/null || nproc)
[ -n "${MAX_JOBS:-}" ] && [ "$MAX_JOBS" -lt "$JOBS" ] 2> /dev/null && JOBS=$MAX_JOBS
export MAX_JOBS=$JOBS FLASHINFER_JIT_PREBUILD_MAX_JOBS=$JOBS FLASHINFER_NVCC_THREADS=1
export WORK SITE FISITE
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TOKENROUTER_HOME=$WORK/home
export FLASHINFER_WORKSPACE_BASE=$WORK TVM_FFI_CACHE_DIR=$WORK/tvm-ffi
export PYTHONPATH="$ROOT:$SITE:$FISITE"
unset TOKENROUTER_PREFILL_BACKEND
ATTN=flashinfer
PREFILL=auto
PREFILL_ARGS=()
FALLBACKS=()
echo "gpu_check.sh: $(date -u +%FT%TZ), budget ${BUDGET} s, $(nproc) cores, MAX_JOBS=$MAX_JOBS, $($PY --version 2>&1), out $OUT"

# GPU_KIT_SIMULATE (tests/test_gpu_kit_stages.py; never on the GPU): "STAGE=RC ..." runs no stage's command but
# appends it, with the environment it would get, to $WORK/commands.log, and returns RC (0 for a stage not
# named; "STAGE=run" runs that one). The decisions below (which stage runs, with what, what is recorded) run.
simulated() {  # stage: prints the status to pretend, or nothing where the stage runs for real
    local kv
    [ -n "${GPU_KIT_SIMULATE:-}" ] || return 0
    for kv in $GPU_KIT_SIMULATE; do
        if [ "${kv%%=*}" = "$1" ]; then
            [ "${kv#*=}" = run ] || echo "${kv#*=}"
            return 0
        fi
    done
    echo 0
}
log_simulated() {  # stage cmd...
    local name=$1
    shift
    printf '%s\tPYTHONPATH=%s\tTOKENROUTER_PREFILL_BACKEND=%s\tMAX_JOBS=%s\t%s\n' "$name" "$PYTHONPATH" \
        "${TOKENROUTER_PREFILL_BACKEND:-}" "$MAX_JOBS" "$*" >> "$WORK/commands.log"
}
skip() {  # name cap why
    echo "== $1: skipped: $3"
    printf '%s\t%s\t0\t-1\tskipped: %s\n' "$1" "$2" "$3" >> "$STAGES"
}
stage() {  # name cap cmd...: run under min(cap, time left); record name, cap, seconds, exit status (RC)
    local name=$1 cap=$2 left t0 sim
    shift 2
    left=$((BUDGET - (SECONDS - START)))
    if [ "$left" -lt 20 ]; then
        skip "$name" "$cap" "no time left ($left s of the budget)"
        RC=-1
        return 1
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    echo "== [$((SECONDS - START)) s] $name (cap $cap s): $*"
    t0=$(date +%s.%N)
    sim=$(simulated "$name")
    if [ -n "$sim" ]; then
        log_simulated "$name" "$@"
        RC=$sim
    else
        timeout -k 10 "$cap" "$@"
        RC=$?
    fi
    local wall
    wall=$($PY -c "import sys,time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t0")
    echo "== $name: exit $RC after $wall s$([ "$RC" = 124 ] && echo " (timed out)")"
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$cap" "$wall" "$RC" "${NOTE:-}" >> "$STAGES"
    NOTE=""
    return "$RC"
}
install_wheels() {
    local pip=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade)
    "${pip[@]}" --target "$SITE" $(BASE_WHEELS) && "${pip[@]}" --target "$FISITE" $(FI_WHEELS) || return 1
    if [ -f .whl/tokenizer.tar.xz ]; then mkdir -p "$WORK/tokenizer" && tar -xJf .whl/tokenizer.tar.xz -C "$WORK/tokenizer"; fi
}
torch_backend() {  # why: flashinfer is left off PYTHONPATH, the later stages run torch's attention backend
    ATTN=torch
    export PYTHONPATH="$ROOT:$SITE"
    FALLBACKS+=("attention torch: flashinfer $1")
    echo "!! flashinfer $1: the later stages run torch's attention backend on CUDA instead (no CUDA graphs)"
}
fa2_prefill() {  # why: flashinfer stays, its prefill forced to FA2 (no FA3 module is then used)
    PREFILL=fa2
    PREFILL_ARGS=(--prefill-backend fa2)
    export TOKENROUTER_PREFILL_BACKEND=fa2
    FALLBACKS+=("prefill fa2: FA3 $1")
    echo "!! FA3 $1: flashinfer stays, with prefill forced to FA2 (bench_gpu.py --prefill-backend fa2," \
        "TOKENROUTER_PREFILL_BACKEND=fa2 for the tests)"
}
export -f install_wheels BASE_WHEELS FI_WHEELS

stage install 90 bash -c "set -e; install_wheels; ls $SITE $FISITE | wc -l"
# The pre-flight, in the first 30 s: a pinned allocation, a one-kernel CUDA graph captured and replayed on a
# side stream, and `import flashinfer` (tvm-ffi's optional torch extension left unbuilt: the import stage
# builds it). Exit 1: a CUDA part failed (reported, the run goes on); 2 or no answer: flashinfer cannot be used.
stage preflight 45 env TVM_FFI_DISABLE_TORCH_C_DLPACK=1 $PY -m scripts.gpu_kit preflight --json "$WORK/preflight.json"
case $RC in
    0) ;;
    1)
        FALLBACKS+=("preflight: a CUDA part failed (preflight.json); the engine may run without CUDA graphs")
        echo "!! preflight: pinned memory or the graph capture failed (above); going on"
        ;;
    -1) torch_backend "was not checked (no time left for the pre-flight)" ;;
    *) torch_backend "failed the pre-flight (exit $RC: the import failed or did not finish)" ;;
esac
stage env 60 $PY -m scripts.gpu_kit check-env --wheels .whl --site "$WORK" --json "$WORK/env.json" ||
    echo "!! env: some requirement is not met (above); going on"
# The first full import of flashinfer imports tvm-ffi, which builds a small torch extension once (cached in
# TVM_FFI_CACHE_DIR) when this torch lacks the DLPack C exchange API; hence a stage of its own.
if [ "$ATTN" = flashinfer ]; then
    stage import 150 $PY -c "import time; t = time.time(); import flashinfer; print(f'flashinfer {flashinfer.__version__} from {flashinfer.__file__}, imported in {time.time() - t:.1f} s')" ||
        torch_backend "failed to import (exit $RC)"
else
    skip import 150 "torch backend"
fi
TOKENIZER=()
[ -f "$WORK/tokenizer/tokenizer.json" ] && TOKENIZER=(--tokenizer "$WORK/tokenizer")
# GPU_KIT_BENCH_ARGS: extra bench_gpu.py arguments, to walk this script through on a CPU machine
# (e.g. "--tiny --device cpu --dtype float32 --concurrency 1 --max-tokens 2"); empty on the GPU.
BENCH_ARGS=(benchmarks/bench_gpu.py --random-weights "${TOKENIZER[@]}" --quick --out "$BENCH" ${GPU_KIT_BENCH_ARGS:-})
# The random-weight pair is written on the CPU while the kernels compile.
(
    t0=$SECONDS
    sim=$(simulated models)
    if [ -n "$sim" ]; then
        log_simulated models $PY "${BENCH_ARGS[@]}" --prepare
        echo "simulated" > "$WORK/prepare.log"
        rc=$sim
    else
        timeout -k 10 240 $PY "${BENCH_ARGS[@]}" --prepare > "$WORK/prepare.log" 2>&1
        rc=$?
    fi
    printf 'models\t240\t%s\t%s\tthe random-weight pair, beside jit\n' $((SECONDS - t0)) $rc > "$WORK/prepare.tsv"
) &
PREPARE=$!
# The JIT in two parts. The page append and FA2 first: all the gpu tests use, and decode everywhere; if they
# fail, torch's backend. FA3 second (prefill rows over 64 tokens on Hopper, ~85% of the compile time): if it
# fails or runs out of time, flashinfer stays with prefill forced to FA2.
if [ "$ATTN" = flashinfer ]; then
    stage jit-fa2 120 $PY -m scripts.gpu_kit warm --part fa2 --json "$WORK/warm-fa2.json" ||
        torch_backend "failed to build its page and FA2 kernels (exit $RC)"
else
    skip jit-fa2 120 "torch backend"
fi
if [ "$ATTN" = flashinfer ]; then
    stage jit-fa3 180 $PY -m scripts.gpu_kit warm --part fa3 --json "$WORK/warm-fa3.json"
    case $RC in
        0) ;;
        -1) fa2_prefill "was not built (no time left)" ;;
        124 | 137) fa2_prefill "did not build within its cap (exit $RC)" ;;
        *) fa2_prefill "failed to build (exit $RC)" ;;
    esac
else
    skip jit-fa3 180 "torch backend"
fi
wait $PREPARE
cat "$WORK/prepare.tsv" >> "$STAGES"
echo "== models: $(cut -f3 "$WORK/prepare.tsv") s, exit $(cut -f4 "$WORK/prepare.tsv"); $(tail -1 "$WORK/prepare.log")"
[ "$(cut -f4 "$WORK/prepare.tsv")" = 0 ] || cat "$WORK/prepare.log"
NOTE="attention $ATTN, prefill $PREFILL" stage tests 120 $PY -m pytest -m gpu tests/engine/attention/test_gpu_backend.py \
    -p no:cacheprovider -q --junitxml "$OUT/pytest.xml"
for step in routed eager single; do  # by worth per second, as the budget may cut the last
    case $step in routed) cap=150 ;; eager) cap=60 ;; single) cap=120 ;; esac
    if [ $step = eager ] && [ "$ATTN" != flashinfer ]; then
        skip eager "$cap" "torch backend, no graphs"
        continue
    fi
    left=$((BUDGET - (SECONDS - START)))
    NOTE="attention $ATTN, prefill $PREFILL" stage $step $cap $PY "${BENCH_ARGS[@]}" "${PREFILL_ARGS[@]}" \
        --steps $step --step-timeout $(( (cap < left ? cap : left) - 10 ))
done
for f in routed.json single.json routed-eager.json; do [ -f "$BENCH/$f" ] && cp "$BENCH/$f" "$OUT/"; done
if [ "$ATTN" = flashinfer ]; then
    stage report 30 $PY -m scripts.gpu_kit jit-report --warm-json "$WORK/warm-fa2.json" "$WORK/warm-fa3.json" \
        --prefill-backend "$PREFILL" --json "$WORK/jit.json"
fi
FALLBACK_ARGS=()
for f in "${FALLBACKS[@]}"; do FALLBACK_ARGS+=(--fallback "$f"); done
$PY -m scripts.gpu_kit summary --out "$OUT" --stages "$STAGES" --attention "$ATTN" --prefill-backend "$PREFILL" \
    --wall $((SECONDS - START)) "${FALLBACK_ARGS[@]}" --include preflight="$WORK/preflight.json" \
    env="$WORK/env.json" jit_fa2="$WORK/warm-fa2.json" jit_fa3="$WORK/warm-fa3.json" jit_report="$WORK/jit.json" \
    bench="$BENCH/summary.json"
echo "results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exec > /dev/null 2>&1
wait $TEE  # the log is whole before the command returns
