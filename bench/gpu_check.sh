#!/usr/bin/env bash
# GPU acceptance check: the GPU tests, then the ResNet-50 step against PyTorch.
#
#   bench/gpu_check.sh [--keep-going] [--log FILE]
#
# Runs from the source tree (PYTHONPATH), installs nothing, and needs only
# python3 with numpy, cupy, pytest (mpi4py and torch when present). Stages:
#   1 environment   python, numpy, minichain from this tree, pytest
#   2 collect       pytest -m gpu --collect-only (the GPU tests import)
#   3 gpu           CuPy importable and a CUDA device answering
#                   -- on a machine without one, the script stops here --
#   4 tests         pytest -m gpu over the suite: every function's CuPy
#                   result and gradients against NumPy's, links, optimizers,
#                   tests/dist/test_gpu.py when mpiexec exists
#   5 nccl          tests/dist/workers/gpu.py single as one MPI process:
#                   pure_nccl with one rank, the NCCL unique-ID broadcast
#   6 resnet        bench/gpu_step.py: ResNet-50, batch 64, 224 px, float32,
#                   minichain next to PyTorch on the same GPU (when importable)
# Each stage runs under `timeout`: its own limit, cut to what is left of a
# 470 s budget, so that the whole script ends within 8 minutes.
#
# Exit status: 0 every stage passed; 77 no CUDA GPU (stages 1-2 passed and
# nothing needing a GPU ran: the automake "skipped" code); 2 bad usage;
# anything else a stage failed (124 = it ran out of time). The first failure
# stops the script unless --keep-going, which runs the remaining stages and
# exits 1 if any failed. CI must not run this script (it is not a test).
#
# The log goes to --log FILE, else $OUT/gpu_check.log when $OUT is set, else
# bench/gpu_check.log. PYTHON picks the interpreter (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KEEP_GOING=0
LOG=""
while [ $# -gt 0 ]; do
    case "$1" in
        --keep-going) KEEP_GOING=1 ;;
        --log) LOG="${2:?--log needs a file}"; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$LOG" ]; then
    if [ -n "${OUT:-}" ]; then LOG="$OUT/gpu_check.log"
    else LOG="$ROOT/bench/gpu_check.log"; fi
fi
mkdir -p "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1

PY="${PYTHON:-python3}"
# pytest's default norecursedirs contains 'dist', which would skip tests/dist.
PYTEST=("$PY" -m pytest -p no:cacheprovider -o "norecursedirs=.* build *.egg venv")
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$ROOT"
START=$SECONDS
DEADLINE=$((START + 470))
FAILED=()

# stage NAME SECONDS CMD...: run CMD under `timeout`, report, and stop at a
# failure unless --keep-going.
stage() {
    local name="$1" limit="$2" rc=0
    shift 2
    local left=$((DEADLINE - SECONDS - 10))  # 10 s for --kill-after
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        echo "=== gpu_check: $name FAILED: no time left in the 470 s budget"
        FAILED+=("$name")
        [ "$KEEP_GOING" -eq 0 ] && exit 124
        return 0
    fi
    echo
    echo "=== gpu_check: $name (limit ${limit}s, at $((SECONDS - START))s)"
    timeout --kill-after=10 "$limit" "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "=== gpu_check: $name passed"
        return 0
    fi
    [ "$rc" -eq 124 ] && echo "=== gpu_check: $name ran out of time (${limit}s)"
    echo "=== gpu_check: $name FAILED (exit $rc)"
    FAILED+=("$name")
    if [ "$KEEP_GOING" -eq 0 ]; then
        echo "gpu_check: FAILED at stage $name; log in $LOG"
        exit "$rc"
    fi
}

echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), source $ROOT"
echo "gpu_check: log $LOG"
if command -v nvidia-smi >/dev/null; then
    timeout 20 nvidia-smi -L || echo "gpu_check: nvidia-smi found no GPU"
else
    echo "gpu_check: no nvidia-smi on PATH"
fi

stage environment 30 "$PY" -c '
import sys, numpy, pytest, minichain
print("python", sys.version.split()[0], "| numpy", numpy.__version__,
      "| pytest", pytest.__version__, "| minichain", minichain.__file__)
for name in ("cupy", "mpi4py", "torch"):
    try:
        mod = __import__(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(name, "not importable:", type(e).__name__, e)
'
stage collect 45 "${PYTEST[@]}" -m gpu --collect-only -q tests

set +e
timeout 30 "$PY" -c '
from minichain import backend
if not backend.gpu_available():
    try:
        backend.check_cuda_available()
    except RuntimeError as e:
        print(e)
    raise SystemExit(1)
cupy = backend.get_cupy()
name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
print("GPU 0:", name.decode() if isinstance(name, bytes) else name,
      "| CUDA runtime", cupy.cuda.runtime.runtimeGetVersion())
'
HAVE_GPU=$?
set -e
if [ "$HAVE_GPU" -ne 0 ]; then
    echo
    if [ "${#FAILED[@]}" -ne 0 ]; then
        echo "gpu_check: no CUDA GPU, and FAILED stages: ${FAILED[*]}; log $LOG"
        exit 1
    fi
    echo "gpu_check: NO CUDA GPU on this machine: stages environment and collect"
    echo "gpu_check: passed; no GPU test and no GPU timing ran (exit 77). Log: $LOG"
    exit 77
fi

stage tests 210 "${PYTEST[@]}" -m gpu -q -rs tests
stage nccl 45 bash -c 'out=$("$1" tests/dist/workers/gpu.py single 2>&1)
    rc=$?; echo "$out"; [ "$rc" -eq 0 ] && grep -q "GPU-OK 0" <<<"$out"' _ "$PY"
stage resnet 120 "$PY" bench/gpu_step.py --batch 64 --size 224 --steps 5 --warmup 2

echo
if [ "${#FAILED[@]}" -ne 0 ]; then
    echo "gpu_check: FAILED stages: ${FAILED[*]} ($((SECONDS - START))s); log $LOG"
    exit 1
fi
echo "gpu_check: all stages passed in $((SECONDS - START))s; log $LOG"
