#!/usr/bin/env bash
# GPU acceptance check: everything minichain does on a GPU, in one short run.
#
#   bench/gpu_check.sh [--dry-run] [--stop-on-failure] [--log FILE]
#                      [--stages resnet,nccl,...]
#
# Written for a machine lent for minutes (a loan of about 15, start-up
# included): the whole run, its own set-up included, is planned in 420 s
# (tests/bench/test_gpu_check.py checks the arithmetic), so that a failed
# first run can be run again. The ResNet-50 figures come first, right after
# the device probe: minichain on its CuPy kernels, minichain with cuDNN,
# PyTorch, at batch 64 and 32, float32 then float16. Every stage runs even
# when an earlier one failed (--stop-on-failure to stop at the first;
# --stages to run some again); the run ends with a one-screen summary:
# device, CUDA, CuPy, NCCL and cuDNN versions, the images/s, and every
# stage's result and time. --dry-run prints the stage plan and exits.
#
# Runs from the source tree (PYTHONPATH) and needs python3 with numpy,
# cupy (with NVRTC and the CUDA headers) and pytest. What a lent machine
# may lack comes with the working tree, installed without a registry: the
# setup stage installs mpi4py and MPICH from bench/wheels
# (bench/gpu_wheels.sh downloads them before the loan; carry that folder)
# when the machine's Python has no working MPI. cuDNN is too large to
# carry: the one the device's PyTorch ships (its nvidia-cudnn wheel) is
# found and loaded, and the environment stage says which, or that none is.
#
# Exit status: 0 every stage passed (skipped ones say why); 77 no CUDA GPU
# here (nothing needing one ran: automake's "skipped"); 2 bad usage or a
# plan over budget; 1 a stage failed, or a GPU is here but a stage could
# not run for a missing library (MPI, NCCL, cuDNN: "MISSING" in the
# summary). CI must not run this script.
#
# The log goes to --log FILE, else $OUT/gpu_check.log when $OUT is set, else
# bench/gpu_check.log. PYTHON picks the interpreter (default python3).
# GPU_CHECK_DRY=1 runs every stage on a machine without a GPU (resnet, warm
# and train run small models on the CPU): a test of this script's plumbing;
# GPU_CHECK_DRY=gpu also takes the probe's answer as "a GPU is here", so
# that a missing library fails the run as on a GPU machine.
# GPU_CHECK_WHEELS names another folder of wheels.
set -uo pipefail

BUDGET=420       # seconds: the whole run, set-up included (8 min loan use)
KILL_AFTER=3     # seconds `timeout` waits after TERM before KILL
OVERHEAD=10      # seconds between the stages (nvidia-smi, checks, summary)
# The plan: stage, limit in seconds, what it checks (--dry-run prints it).
PLAN=(
    "setup 15 mpi4py and MPICH from the carried wheels (bench/wheels) when MPI is missing; no registry"
    "environment 10 versions: python, numpy, CuPy, CUDA runtime and driver, NVRTC, NCCL, cuDNN (which one), mpi4py, torch"
    "probe 15 a CUDA device answers and CuPy compiles a kernel (no GPU: exit 77; a CUDA error: fail)"
    "resnet 150 bench/gpu_step.py: ResNet-50 224 px, batch 64 and 32, float32 then float16: minichain CuPy, minichain cuDNN, PyTorch"
    "warm 25 bench/gpu_warm.py: every kernel of a small step compiled once (float16/32/64) for the stages after"
    "nccl 35 tests/dist/test_gpu.py, one rank: pure_nccl and hierarchical, float16/bfloat16 wire, overlap, teardown"
    "nccl2 25 with 2+ GPUs: 2 ranks, bfloat16 overlapped averaging against the true mean"
    "cudnn 20 tests/kernels/test_cudnn.py -m gpu: each cuDNN kernel against its op's body, float16/32"
    "tests 40 pytest -m gpu: every function and kernel on the device against NumPy, float16/32/64"
    "cupy-api 10 tests/cuda/test_cupy_api.py: every CuPy and NCCL name the code uses exists here"
    "train 30 bench/gpu_resume.py: models/train_resnet50.py --device gpu, snapshot, exact resume"
)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN=0
KEEP_GOING=1
LOG=""
STAGES=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --keep-going) KEEP_GOING=1 ;;   # the default; kept for old callers
        --stop-on-failure) KEEP_GOING=0 ;;
        --log) LOG="${2:?--log needs a file}"; shift ;;
        --stages) STAGES=",${2:?--stages needs a list},"; shift ;;
        -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

print_plan() {
    local row total=$OVERHEAD name limit what
    echo "gpu_check plan (budget ${BUDGET} s; each stage may take ${KILL_AFTER} s more to be killed;" \
         "${OVERHEAD} s between stages):"
    for row in "${PLAN[@]}"; do
        read -r name limit what <<< "$row"
        printf '  %-12s %4d s  %s\n' "$name" "$limit" "$what"
        total=$((total + limit + KILL_AFTER))
    done
    echo "gpu_check plan: total ${total} s with kill grace and overhead, budget ${BUDGET} s"
    if [ "$total" -gt "$BUDGET" ]; then
        echo "gpu_check plan: OVER BUDGET by $((total - BUDGET)) s" >&2
        return 1
    fi
    echo "gpu_check plan: within budget ($((BUDGET - total)) s to spare)"
}

if [ "$DRY_RUN" -eq 1 ]; then
    print_plan
    exit $(( $? == 0 ? 0 : 2 ))
fi
print_plan >/dev/null || { print_plan; exit 2; }

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
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
DEADLINE=$((START + BUDGET))
FAILED=0
: > "$WORK/stages"

plan_limit() {  # plan_limit STAGE: its limit in the plan
    local row n l w
    for row in "${PLAN[@]}"; do
        read -r n l w <<< "$row"
        [ "$n" = "$1" ] && { echo "$l"; return; }
    done
}

record() {  # record STAGE RESULT SECONDS NOTE
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >> "$WORK/stages"
}

# stage NAME CMD...: run CMD under `timeout` with NAME's limit from the plan
# (cut to what is left of the budget), its output also kept in
# $WORK/NAME.out for the summary.
stage() {
    local name="$1" limit rc begin
    shift
    limit=$(plan_limit "$name")
    local left=$((DEADLINE - SECONDS - KILL_AFTER))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        echo "=== gpu_check: $name FAILED: no time left in the ${BUDGET} s budget"
        record "$name" 'no time' 0
        FAILED=1
        return 1
    fi
    echo
    echo "=== gpu_check: $name (limit ${limit}s, at $((SECONDS - START))s)"
    begin=$SECONDS
    timeout --kill-after="$KILL_AFTER" "$limit" "$@" 2>&1 | tee "$WORK/$name.out"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        echo "=== gpu_check: $name passed ($((SECONDS - begin))s)"
        record "$name" passed $((SECONDS - begin))
        return 0
    fi
    FAILED=1
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "=== gpu_check: $name ran out of time (${limit}s)"
        record "$name" timeout $((SECONDS - begin)) "limit ${limit}s"
    else
        echo "=== gpu_check: $name FAILED (exit $rc)"
        record "$name" FAILED $((SECONDS - begin)) "exit $rc"
    fi
    if [ "$KEEP_GOING" -eq 0 ]; then
        summary
        exit 1
    fi
    return 1
}

skip() {
    echo
    echo "=== gpu_check: $1 SKIPPED: $2"
    record "$1" skipped 0 "$2"
}

# A stage that cannot run for a missing library: skipped without a GPU,
# a failure with one (the point of the loan was to run it).
missing() {
    if [ "$HAVE_GPU" = 1 ]; then
        echo
        echo "=== gpu_check: $1 MISSING (a GPU is here): $2"
        record "$1" MISSING 0 "$2"
        FAILED=1
    else
        skip "$1" "$2"
    fi
}

wanted() {  # wanted STAGE: not left out by --stages
    [ -z "$STAGES" ] || [[ "$STAGES" == *",$1,"* ]]
}

# The one-screen summary, from the environment stage's facts, the resnet
# stage's GPU_STEP lines and the stage records.
summary() {
    "$PY" - "$WORK" "$((SECONDS - START))" "$BUDGET" "$LOG" <<'EOF'
import json, os, sys
work, took, budget, log = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

def read(name):
    path = os.path.join(work, name)
    return open(path).read().splitlines() if os.path.exists(path) else []

facts = dict(line[len('FACT '):].split('=', 1)
             for line in read('environment.out') if line.startswith('FACT '))
print()
print('=' * 28, 'gpu_check summary', '=' * 28)
print('device   {}'.format(facts.get('device', '(no device answered)')))
print('CUDA     runtime {}, driver {} | NVRTC {}'.format(
    facts.get('cuda_runtime', '?'), facts.get('cuda_driver', '?'),
    facts.get('nvrtc', '?')))
print('CuPy     {} | NCCL {} | torch {}'.format(
    facts.get('cupy', '?'), facts.get('nccl', '?'), facts.get('torch', '?')))
steps = [json.loads(line[9:]) for line in read('resnet.out')
         if line.startswith('GPU_STEP ')]
print('cuDNN    {}'.format(facts.get('cudnn', '?')))
if steps:
    print('{} {} px (TF32 {}) on {}, images/s:'.format(
        steps[0]['arch'], steps[0]['size'], steps[0].get('tf32', 'off'),
        steps[0]['device']))
    print('  dtype    batch  minichain  +cuDNN   PyTorch  best/PyTorch')

    def cell(s, key):
        return '{:.1f}'.format(s[key]) if key in s else '-'
    for s in steps:
        print('  {:7s}  {:5d}  {:>9}  {:>7}  {:>8}  {:>12}'.format(
            s.get('dtype', 'float32'), s['batch'],
            cell(s, 'minichain_img_s'), cell(s, 'cudnn_img_s'),
            cell(s, 'torch_img_s'),
            '{:.2f}x'.format(s['ratio']) if 'ratio' in s else '-'))
    print('  kernel launches per step (CUPTI): ' + '; '.join(
        '{} {} {}/{}'.format(s.get('dtype', 'float32'), s['batch'],
                             s.get('minichain_launches', '-'),
                             s.get('cudnn_launches', '-')) for s in steps)
          + ' (minichain/+cuDNN)')
else:
    print('ResNet-50: no figure (see the resnet stage)')
print('  stage        result    time  note')
for line in read('stages'):
    name, result, seconds, note = line.split('\t')
    print('  {:12s} {:8s} {:>4}s  {}'.format(name, result, seconds, note))
print('total {} s of a {} s budget; log {}'.format(took, budget, log))
EOF
}

echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), source $ROOT"
echo "gpu_check: log $LOG"
SMI_GPUS=0
if command -v nvidia-smi >/dev/null; then
    timeout 5 nvidia-smi -L | tee "$WORK/smi"
    SMI_GPUS=$(grep -c '^GPU' "$WORK/smi")
else
    echo "gpu_check: no nvidia-smi on PATH"
fi

# setup: MPI from the carried wheels when the machine's Python has none
# working; its variables (bench/gpu_setup.sh writes them) hold for the
# stages after.
stage setup bash bench/gpu_setup.sh "$PY" "$WORK" \
    "${GPU_CHECK_WHEELS:-$ROOT/bench/wheels}"
[ -f "$WORK/env" ] && . "$WORK/env"

stage environment "$PY" -W ignore -c '
import sys, numpy, pytest, minichain
print("python", sys.version.split()[0], "| numpy", numpy.__version__,
      "| pytest", pytest.__version__, "| minichain", minichain.__file__)
def fact(key, value):
    print("FACT {}={}".format(key, value))
for name in ("cupy", "mpi4py", "torch"):
    try:
        mod = __import__(name)
        fact(name, getattr(mod, "__version__", "?"))
    except Exception as e:
        print(name, "not importable:", type(e).__name__, e)
        fact(name, "not importable")
try:
    import cupy
    fact("nvrtc", ".".join(map(str, cupy.cuda.nvrtc.getVersion())))
    rt = cupy.cuda.runtime
    v = lambda n: "{}.{}".format(n // 1000, n % 1000 // 10)
    fact("cuda_runtime", v(rt.runtimeGetVersion()))
    fact("cuda_driver", v(rt.driverGetVersion()))
    from cupy.cuda import nccl
    fact("nccl", nccl.get_version() if nccl.available else "not available")
    p = rt.getDeviceProperties(0)
    name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
    fact("device", "{} (sm_{}{}), {:.0f} GiB, {} visible".format(
        name, p["major"], p["minor"], p["totalGlobalMem"] / 2 ** 30,
        rt.getDeviceCount()))
except Exception as e:
    print("CuPy/CUDA:", type(e).__name__, e)
try:
    import torch
    print("torch CUDA", torch.version.cuda, "| cuDNN",
          torch.backends.cudnn.version())
except Exception:
    pass
from minichain.kernels import cudnn
fact("cudnn", cudnn.describe())
'

# probe (not a plain stage: its outcome decides what runs next): exit 3
# when there is no GPU here, anything else non-zero when CUDA or CuPy fail
echo
echo "=== gpu_check: probe (limit $(plan_limit probe)s, at $((SECONDS - START))s)"
begin=$SECONDS
timeout --kill-after="$KILL_AFTER" "$(plan_limit probe)" "$PY" -W ignore -c '
from minichain import backend
absent, why = backend.gpu_problem()
if why:
    print("no usable GPU:" if absent else "CUDA FAILED:", why)
    raise SystemExit(3 if absent else 1)
backend.check_cuda_available()   # NVRTC and the headers
cupy = backend.get_cupy()
print("first kernel:", float((cupy.arange(4.0) * 2).sum()))
' 2>&1 | tee "$WORK/probe.out"
case "${PIPESTATUS[0]}" in
    0) PROBE=passed ;;
    3) PROBE='no GPU' ;;
    *) PROBE=FAILED; FAILED=1 ;;
esac
echo "=== gpu_check: probe $PROBE ($((SECONDS - begin))s)"
record probe "$PROBE" $((SECONDS - begin))
DRY="${GPU_CHECK_DRY:-0}"
HAVE_GPU=0
[ "$PROBE" = passed ] && HAVE_GPU=1
if [ "$DRY" = gpu ]; then  # the probe's answer taken as "a GPU is here"
    DRY=1 HAVE_GPU=1
fi
STEP_ARGS=(--batch 64 32 --dtype float32 float16 --size 224 --steps 3
           --warmup 1)
RESUME_ARGS=(--device gpu --arch resnet50 --batch 16 --size 64 --per-epoch 3)
WARM_ARGS=(--device gpu)
if [ "$DRY" = 1 ]; then
    echo "gpu_check: GPU_CHECK_DRY: the GPU stages run on the CPU, small" \
         "(a GPU taken as present: $HAVE_GPU)"
    STEP_ARGS=(--device cpu --arch resnet18 --batch 4 2 --dtype float32
               float16 --size 32 --steps 1 --warmup 0)
    RESUME_ARGS=(--device cpu --arch resnet18 --batch 2 --size 8
                 --per-epoch 3)
    WARM_ARGS=(--device cpu)
elif [ "$PROBE" != passed ]; then
    if [ "$PROBE" = 'no GPU' ] && [ "$SMI_GPUS" -eq 0 ]; then
        echo "gpu_check: NO CUDA GPU on this machine: nothing needing one ran (exit 77)"
        summary
        exit 77
    fi
    echo "gpu_check: the device probe FAILED on a machine with a GPU" \
         "(nvidia-smi lists ${SMI_GPUS}): see its lines above"
    summary
    exit 1
fi

# What each library-bound stage lacks ('' when nothing): MPI (mpi4py and a
# launcher), NCCL (through CuPy: not asked in a dry run, which has no
# GPU for it), cuDNN (minichain's loader: the device's PyTorch's copy).
MPI_WHY=$("$PY" -W ignore -c '
try:
    import mpi4py.MPI
except Exception as e:
    print("mpi4py is not usable ({}: {})".format(type(e).__name__, e))
    raise SystemExit
from minichain.dist import launcher
print("" if launcher.find_mpiexec() else "no mpiexec: " + launcher.INSTALL_HINT)
' 2>&1 | tail -1)
NCCL_WHY=""
if [ "$DRY" != 1 ]; then
    NCCL_WHY=$("$PY" -W ignore -c '
from minichain import backend
try:
    backend.get_nccl()
except RuntimeError as e:
    print(e)' 2>&1 | tail -1)
fi
CUDNN_WHY=$("$PY" -W ignore -c '
from minichain.kernels import cudnn
print(cudnn.problem())' 2>&1 | tail -1)
GPUS=$("$PY" -W ignore -c '
from minichain import device
print(device.visible_gpu_count())' 2>/dev/null || echo 0)

wanted resnet && stage resnet "$PY" bench/gpu_step.py "${STEP_ARGS[@]}"
wanted warm && stage warm "$PY" bench/gpu_warm.py "${WARM_ARGS[@]}"

if wanted nccl || wanted nccl2; then
    why="${MPI_WHY:-$NCCL_WHY}"
    if [ -n "$why" ]; then
        wanted nccl && missing nccl "$why"
        wanted nccl2 && missing nccl2 "$why"
    else
        wanted nccl && stage nccl "${PYTEST[@]}" -q -s -rs \
            tests/dist/test_gpu.py -k 'not bfloat16_overlap_equals_the_true_mean'
        if ! wanted nccl2; then :
        elif [ "${GPUS:-0}" -ge 2 ]; then
            stage nccl2 "${PYTEST[@]}" -q -s -rs tests/dist/test_gpu.py \
                -k 'bfloat16_overlap_equals_the_true_mean'
        else
            skip nccl2 "needs 2 GPUs, ${GPUS:-0} visible"
        fi
    fi
fi

if ! wanted cudnn; then :
elif [ -n "$CUDNN_WHY" ]; then
    missing cudnn "$CUDNN_WHY"
else
    stage cudnn "${PYTEST[@]}" -m gpu -q -rs tests/kernels/test_cudnn.py
fi
# tests/dist/test_gpu.py and test_cudnn.py ran in their own stages
wanted tests && stage tests "${PYTEST[@]}" -m gpu -q -rs tests \
    --ignore tests/dist/test_gpu.py --ignore tests/kernels/test_cudnn.py
if ! wanted cupy-api; then :
elif "$PY" -W ignore -c 'import cupy' 2>/dev/null; then
    stage cupy-api "${PYTEST[@]}" -q tests/cuda/test_cupy_api.py
else
    skip cupy-api 'CuPy is not importable'
fi
if ! wanted train; then :
elif [[ "$MPI_WHY" == mpi4py* ]]; then  # one process, but MPI all the same
    missing train "models/train_resnet50.py needs it: $MPI_WHY"
else
    stage train "$PY" bench/gpu_resume.py "${RESUME_ARGS[@]}"
fi

summary
exit "$FAILED"
