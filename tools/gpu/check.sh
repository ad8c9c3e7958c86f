#!/usr/bin/env bash
# The GPU session in one call: set up, run the CUDA tests on the GPU, sanitize, benchmark, tabulate.
#
# On the GPU machine (offline; Python 3.12 with numpy, cuda-python, torch), from the repository
# root, with .whl/ carried (tools/gpu/fetch_wheels.sh fills it):
#
#     bash tools/gpu/check.sh
#
# Here, without a GPU, as far as it can go (venv, wheels, imports, tiny models, the benchmark
# on the CUDA emulator), to know the script works before a session:
#
#     CHECK_DRY_RUN=1 bash tools/gpu/check.sh
#
# Steps, each under a time limit and within CHECK_BUDGET seconds in all (default 450): each
# one's outcome is recorded and the next runs whatever happened before.
#   machine    nvidia-smi, nvcc, Python and the packages the GPU machine has
#   venv       a venv with --system-site-packages (and the parent venv's packages where python3
#              is itself a venv), the carried wheels of .whl/ that fit this Python
#   pycuda     PyCUDA imports; else it is built from the carried sdist against the machine's toolkit
#   models     (in the background from the start) tools/gpu/make_shapes.py's four models, and
#              a 2-layer set for the sanitizers
#   probe      what backends.cuda.probe says, and which kernel images are stale
#   tests      pytest tests/backends/cuda with SPRIG_CUDA_DEVICE=gpu
#   bench      python -m engine bench --backend cuda --json on each model
#   peer       llama.cpp's figures, if a llama_cpp_python wheel is in .whl/
#   bandwidth  a device-to-device copy (tools/gpu/copy_bandwidth.py)
#   sanitizer  compute-sanitizer memcheck (three small models), racecheck and synccheck (one)
#   table      $OUT/gpu-table.md: the steps' outcomes and the speed table (tools/gpu/gpu_table.py)
#
# Results under $OUT (default /tmp/sprig-gpu-out): gpu-table.md, check.log (every step's output),
# bench.jsonl, bandwidth.json.
set -u
cd "$(dirname "$0")/../.." || exit 2
export REPO=$PWD
export DRY=${CHECK_DRY_RUN:-0}
export OUT=${OUT:-/tmp/sprig-gpu-out}
export PYTHON=${PYTHON:-python3}
export VENV=${VENV:-/tmp/sprig-gpu-venv}
export MODELS=${MODELS:-/tmp/sprig-gpu-models}
export PY=$VENV/bin/python
export PYTHONUNBUFFERED=1 PYTHONPATH=$REPO
BUDGET=${CHECK_BUDGET:-450}
mkdir -p "$OUT" "$MODELS"
LOG=$OUT/check.log
STEPS=$OUT/steps.md
: >"$LOG"
: >"$STEPS"
: >"$OUT/bench.jsonl"

# step NAME LIMIT FUNCTION [ARGS]: run FUNCTION under `timeout` (LIMIT seconds, less if the budget
# is short), its output into the log, and record how it went.
step() {
    local name=$1 limit=$2 started=$SECONDS rc outcome
    shift 2
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 15 ]; then
        echo "| $name | skipped: out of time | 0 s |" >>"$STEPS"
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "=== $name (limit ${limit}s)" | tee -a "$LOG"
    timeout --kill-after=10 "$limit" bash -c "$(declare -f "$1"); $(printf '%q ' "$@")" >>"$LOG" 2>&1
    rc=$?
    case $rc in
        0) outcome=ok ;;
        124 | 137) outcome="timed out after ${limit} s" ;;
        *) outcome="failed (exit $rc)" ;;
    esac
    echo "| $name | $outcome | $((SECONDS - started)) s |" >>"$STEPS"
    echo "--- $name: $outcome, $((SECONDS - started)) s" | tee -a "$LOG"
    return $rc
}

machine() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    command -v nvcc && nvcc --version | tail -2
    command -v compute-sanitizer
    nproc
    "$PYTHON" --version
    "$PYTHON" -m pip list 2>/dev/null | grep -iE '^(numpy|cuda-bindings|cuda-python|torch|cupy|pytest|tokenizers|jinja2) '
    return 0
}

venv() {
    rm -rf "$VENV"
    "$PYTHON" -m venv --system-site-packages "$VENV" || return 1
    # Where python3 is itself a venv (/opt/torch/.venv), its packages are not the system's: list them too.
    "$PYTHON" - "$VENV" <<'EOF' || return 1
import subprocess, sys, sysconfig
if sys.prefix != sys.base_prefix:
    parent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    ours = subprocess.run([f"{sys.argv[1]}/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(f"{ours}/_parent_venv.pth", "w") as pth:
        pth.write("\n".join(sorted(parent)) + "\n")
    print("parent venv's packages:", *sorted(parent))
EOF
    # The carried wheels this Python can install (the llama.cpp wheel goes in the peer step).
    mapfile -t wheels < <("$PY" - <<'EOF'
from pathlib import Path
from pip._vendor.packaging.tags import sys_tags
from pip._vendor.packaging.utils import parse_wheel_filename
supported = set(sys_tags())
for path in sorted(Path(".whl").glob("*.whl")):
    name, _, _, tags = parse_wheel_filename(path.name)
    if name != "llama-cpp-python" and tags & supported:
        print(path)
EOF
    )
    echo "installing ${#wheels[@]} wheels: ${wheels[*]}"
    [ "${#wheels[@]}" -eq 0 ] || "$PY" -m pip install -q --no-index --no-deps --no-compile "${wheels[@]}"
}

pycuda() {
    if [ "$DRY" = 1 ]; then  # no driver here: pycuda.driver cannot load; the package and its compiler can
        "$PY" -c "import pycuda, pycuda.compiler; print('pycuda', pycuda.VERSION, 'imports (no driver here)')"
        return
    fi
    "$PY" -c "import pycuda.driver as cuda; cuda.init(); print('pycuda', cuda.get_version(), cuda.Device(0).name())" && return
    echo "the carried PyCUDA does not load: building it from the sdist against this machine's toolkit"
    local nvcc
    nvcc=$(command -v nvcc) || return 1
    CUDA_ROOT=$(dirname "$(dirname "$nvcc")") bash tools/gpu/build_pycuda_wheel.sh "$PY" || return 1
    "$PY" -m pip install -q --no-index --no-deps --force-reinstall .whl/pycuda-*-"$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"-*.whl
    "$PY" -c "import pycuda.driver as cuda; cuda.init(); print('pycuda', cuda.get_version(), cuda.Device(0).name())"
}

models() {  # in the background: the benchmark's models, and small ones for the sanitizers
    local size=()
    [ "$DRY" = 1 ] && size=(--layers 1 --vocab 512)
    "$PY" -m tools.gpu.make_shapes --dir "$MODELS/bench" "${size[@]}" &&
        "$PY" -m tools.gpu.make_shapes --dir "$MODELS/small" --layers 2 --vocab 2048
}

probe() {
    "$PY" - <<'EOF'
from backends.cuda.modules import stale_modules
from backends.cuda.probe import probe, unavailable_reason
found = probe()
print(found)
print("reason:", unavailable_reason(found))
print("stale or missing kernel images:", stale_modules() or "none")
EOF
}

tests() {
    if [ "$DRY" = 1 ]; then
        "$PY" -m pytest -q -rs -p no:cacheprovider tests/backends/cuda/test_probe.py \
            tests/backends/cuda/test_device_contract.py tests/backends/cuda/test_gpu_session_tools.py
    else  # the compile checks and the emulator's own tests need no GPU: CI runs them
        SPRIG_CUDA_DEVICE=gpu "$PY" -m pytest -q -rs -p no:cacheprovider --durations=15 tests/backends/cuda \
            --ignore=tests/backends/cuda/test_kernels_compile.py --ignore=tests/backends/cuda/test_emulator.py
    fi
}

bench() {  # bench MODEL...: engine bench's JSON into bench.jsonl
    local options=() model
    [ "$DRY" = 1 ] && export SPRIG_CUDA_DEVICE=emulator && options=(--prompt-tokens 8 --gen-tokens 4)
    for model in "$@"; do
        echo "$model"
        "$PY" -m engine bench --model "$MODELS/bench/$model" --backend cuda --json "${options[@]}" | tee -a "$OUT/bench.jsonl"
    done
}

peer() {
    local wheel
    wheel=$(ls .whl/llama_cpp_python-*.whl 2>/dev/null | head -1)
    [ -n "$wheel" ] || { echo "no llama_cpp_python wheel in .whl/: the table compares with the copy bandwidth"; return 0; }
    "$PY" -m pip install -q --no-index --no-deps "$wheel" || return 1
    for model in "$@"; do
        "$PY" tools/gpu/llama_cpp_on_gpu.py "$MODELS/bench/$model" --threads 16 | tee -a "$OUT/bench.jsonl"
    done
}

bandwidth() {
    if [ "$DRY" = 1 ]; then
        echo '{"traffic_gb_s": 1.0, "timed_by": "nothing: a dry run"}' | tee "$OUT/bandwidth.json"
    else
        "$PY" -m tools.gpu.copy_bandwidth | tee "$OUT/bandwidth.json"
    fi
}

sanitize() {  # sanitize TOOL MODEL: a short bench of MODEL under compute-sanitizer's TOOL
    compute-sanitizer --tool "$1" --error-exitcode 1 --print-limit 20 --target-processes all \
        "$PY" -m engine bench --model "$MODELS/small/$2" --backend cuda --prompt-tokens 8 --gen-tokens 4 --json
}

wait_models() {
    tail -c 4000 "$OUT/models.log"
    grep -q "^exit 0$" "$OUT/models.log"
}

table() {
    "$PY" -m tools.gpu.gpu_table --bench "$OUT/bench.jsonl" --bandwidth "$OUT/bandwidth.json" --models "$MODELS/bench" \
        >"$OUT/speed.md" && cat "$OUT/speed.md"
}

BENCH_MODELS=(smollm2-135m-shape-q4_1.gguf gemma3-270m-shape-q4_k_m.gguf qwen3-8b-shape-q4_k_m.gguf
    bonsai-8b-shape-q1_0.gguf)
[ "$DRY" = 1 ] && BENCH_MODELS=("${BENCH_MODELS[@]:0:2}")  # the 8B shapes are too slow on the emulator

step machine 30 machine
step venv 90 venv
(models >"$OUT/models.log" 2>&1; echo "exit $?" >>"$OUT/models.log") &
models_job=$!
step pycuda 300 pycuda
step probe 30 probe
step tests 180 tests
while kill -0 "$models_job" 2>/dev/null && [ $((BUDGET - SECONDS)) -gt 60 ]; do sleep 2; done
step models 10 wait_models
for model in "${BENCH_MODELS[@]}"; do
    step "bench ${model%.gguf}" 100 bench "$model"
done
step peer 120 peer "${BENCH_MODELS[@]}"
step bandwidth 60 bandwidth
if [ "$DRY" != 1 ]; then
    for model in gemma3-270m-shape-q4_k_m.gguf smollm2-135m-shape-q4_1.gguf bonsai-8b-shape-q1_0.gguf; do
        step "memcheck ${model%.gguf}" 90 sanitize memcheck "$model"
    done
    step "racecheck gemma3-270m-shape" 120 sanitize racecheck gemma3-270m-shape-q4_k_m.gguf
    step "synccheck gemma3-270m-shape" 90 sanitize synccheck gemma3-270m-shape-q4_k_m.gguf
fi
step table 30 table

{
    echo "# GPU session $(date -u +%Y-%m-%dT%H:%MZ)$([ "$DRY" = 1 ] && echo ' (dry run: no GPU, the CUDA emulator)')"
    echo
    echo "| step | outcome | time |"
    echo "| --- | --- | ---: |"
    cat "$STEPS"
    echo
    cat "$OUT/speed.md" 2>/dev/null || echo "(no speed table: see check.log)"
} >"$OUT/gpu-table.md"
cat "$OUT/models.log" >>"$LOG"
rm -f "$STEPS" "$OUT/models.log" "$OUT/speed.md"
cat "$OUT/gpu-table.md"
