#!/usr/bin/env bash
# GPU acceptance check: everything minichain does on a GPU, in one run.
#
#   bench/gpu_check.sh [--keep-going] [--log FILE]
#
# Runs from the source tree (PYTHONPATH), installs nothing, and needs only
# python3 with numpy, cupy (with NVRTC and the CUDA headers), pytest;
# mpi4py (+ mpiexec) and torch are used when present, and their stages are
# skipped with the reason otherwise. Stages:
#   1 environment  versions: python, numpy, CuPy, NVRTC, NCCL, mpi4py, torch
#   2 collect      pytest -m gpu --collect-only (the GPU tests import)
#   3 gpu          a CUDA device answers and CuPy can compile kernels
#                  -- on a machine without one, the script stops here --
#   4 nccl         tests/dist/workers/gpu.py as MPI jobs: pure_nccl and
#                  hierarchical with one rank (unique-ID broadcast, gradients
#                  against NumPy, float16/bfloat16 transfer with planted NaN
#                  of CUDA's bit patterns, double buffering, synchronized BN,
#                  finalize waiting for a busy stream), teardown at exit, and
#                  two ranks on one GPU refused on both (skipped without
#                  mpi4py or mpiexec, saying so)
#   5 tests        pytest -m gpu over the suite: every function's CuPy result
#                  and gradients against NumPy's, every minichain kernel on
#                  the device in float16/32/64 (tests/functions/
#                  test_cuda_kernels.py), the kernel sources CuPy generated
#                  against those that CI compiles (tests/cuda), links,
#                  optimizers, float16 batch norm against float64
#   6 cupy-api     tests/cuda/test_cupy_api.py: every CuPy/NCCL name the code
#                  uses exists in this CuPy
#   7 resnet       bench/gpu_step.py: ResNet-50, batch 32 and 64, 224 px,
#                  float32, minichain next to PyTorch (cuDNN) on the same GPU:
#                  s/step, images/s, peak memory, ratio
#   8 train        bench/gpu_resume.py: models/train_resnet50.py --device gpu
#                  for 6 iterations with snapshots, resumed from iteration 3
#                  to the same end: equal bit for bit (needs mpi4py, not
#                  mpiexec)
# Each stage runs under `timeout`: its own limit, cut to what is left of a
# 470 s budget, so that the whole script ends within 8 minutes.
#
# Exit status: 0 every stage passed (skipped stages say why); 77 no CUDA GPU
# (stages 1-2 passed and nothing needing a GPU ran: the automake "skipped"
# code); 2 bad usage; anything else a stage failed (124 = it ran out of
# time). The first failure stops the script unless --keep-going, which runs
# the remaining stages and exits 1 if any failed. CI must not run this
# script (it is not a test).
#
# The log goes to --log FILE, else $OUT/gpu_check.log when $OUT is set, else
# bench/gpu_check.log. PYTHON picks the interpreter (default python3).
# GPU_CHECK_DRY=1 runs every stage on a machine without a GPU (stage 3 does
# not stop it; resnet and train run small models on the CPU): a test of
# this script's own plumbing, not of the GPU.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KEEP_GOING=0
LOG=""
while [ $# -gt 0 ]; do
    case "$1" in
        --keep-going) KEEP_GOING=1 ;;
        --log) LOG="${2:?--log needs a file}"; shift ;;
        -h|--help) sed -n '2,49p' "$0"; exit 0 ;;
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
SKIPPED=()

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
        echo "=== gpu_check: $name passed ($((SECONDS - START))s)"
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

skip() {
    echo
    echo "=== gpu_check: $1 SKIPPED: $2"
    SKIPPED+=("$1 ($2)")
}

echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), source $ROOT"
echo "gpu_check: log $LOG"
if command -v nvidia-smi >/dev/null; then
    timeout 20 nvidia-smi -L || echo "gpu_check: nvidia-smi found no GPU"
else
    echo "gpu_check: no nvidia-smi on PATH"
fi

stage environment 30 "$PY" -W ignore -c '
import sys, numpy, pytest, minichain
print("python", sys.version.split()[0], "| numpy", numpy.__version__,
      "| pytest", pytest.__version__, "| minichain", minichain.__file__)
for name in ("cupy", "mpi4py", "torch"):
    try:
        mod = __import__(name)
        print(name, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(name, "not importable:", type(e).__name__, e)
try:
    import cupy
    print("NVRTC", cupy.cuda.nvrtc.getVersion())
    from cupy.cuda import nccl
    print("NCCL", nccl.get_version() if nccl.available else "not available")
except Exception as e:
    print("CuPy libraries:", type(e).__name__, e)
try:
    import torch
    print("torch CUDA", torch.version.cuda, "| cuDNN",
          torch.backends.cudnn.version())
except Exception:
    pass
'
stage collect 45 "${PYTEST[@]}" -m gpu --collect-only -qq tests

set +e
timeout 60 "$PY" -W ignore -c '
from minichain import backend
try:
    backend.check_cuda_available()   # device, NVRTC and headers
except RuntimeError as e:
    print(e)
    raise SystemExit(1)
cupy = backend.get_cupy()
name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
print("GPU 0:", name.decode() if isinstance(name, bytes) else name,
      "| CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "| driver", cupy.cuda.runtime.driverGetVersion(),
      "| sm_%s" % cupy.cuda.Device(0).compute_capability)
print("first kernel:", float((cupy.arange(4.0) * 2).sum()))
'
HAVE_GPU=$?
set -e
DRY="${GPU_CHECK_DRY:-0}"
STEP_ARGS=(--batch 32 64 --size 224 --steps 5 --warmup 2)
RESUME_ARGS=(--device gpu --arch resnet50 --batch 16 --size 64 --per-epoch 3)
if [ "$DRY" = 1 ]; then
    echo "gpu_check: GPU_CHECK_DRY=1: the GPU stages run on the CPU, small"
    STEP_ARGS=(--device cpu --arch resnet18 --batch 2 4 --size 32 --steps 1
               --warmup 0)
    RESUME_ARGS=(--device cpu --arch resnet18 --batch 2 --size 8
                 --per-epoch 3)
fi
if [ "$HAVE_GPU" -ne 0 ] && [ "$DRY" != 1 ]; then
    echo
    if [ "${#FAILED[@]}" -ne 0 ]; then
        echo "gpu_check: no usable CUDA GPU, and FAILED stages: ${FAILED[*]}; log $LOG"
        exit 1
    fi
    echo "gpu_check: NO USABLE CUDA GPU on this machine: stages environment and"
    echo "gpu_check: collect passed; no GPU test and no GPU timing ran (exit 77). Log: $LOG"
    exit 77
fi

# 4 nccl: tests/dist/test_gpu.py launches tests/dist/workers/gpu.py under
# mpiexec (modes single, exit, shared, auto), printing each job's output.
MPI_WHY=$("$PY" -W ignore -c '
try:
    import mpi4py.MPI
except Exception as e:
    print("mpi4py is not importable ({}: {})".format(type(e).__name__, e))
    raise SystemExit
from minichain.dist import launcher
print("" if launcher.find_mpiexec() else "no mpiexec: " + launcher.INSTALL_HINT)
' 2>&1 | tail -1)
if [ -n "$MPI_WHY" ]; then
    skip nccl "$MPI_WHY"
else
    stage nccl 90 "${PYTEST[@]}" -q -s -rs tests/dist/test_gpu.py
fi

# 5 tests: tests/dist/test_gpu.py ran in stage 4
stage tests 150 "${PYTEST[@]}" -m gpu -q -rs tests \
    --ignore tests/dist/test_gpu.py
if "$PY" -W ignore -c 'import cupy' 2>/dev/null; then
    stage cupy-api 30 "${PYTEST[@]}" -q tests/cuda/test_cupy_api.py
else
    skip cupy-api 'CuPy is not importable'
fi

# 7 resnet: PyTorch next to minichain when importable with CUDA
stage resnet 120 "$PY" bench/gpu_step.py "${STEP_ARGS[@]}"

# 8 train: a few iterations of the training script, snapshot, exact resume
if [[ "$MPI_WHY" == mpi4py* ]]; then  # one process, but MPI all the same
    skip train "models/train_resnet50.py needs it: $MPI_WHY"
else
    stage train 100 "$PY" bench/gpu_resume.py "${RESUME_ARGS[@]}"
fi

echo
for s in "${SKIPPED[@]}"; do echo "gpu_check: skipped: $s"; done
if [ "${#FAILED[@]}" -ne 0 ]; then
    echo "gpu_check: FAILED stages: ${FAILED[*]} ($((SECONDS - START))s); log $LOG"
    exit 1
fi
echo "gpu_check: all stages passed in $((SECONDS - START))s; log $LOG"
