#!/usr/bin/env bash
# Compile every CUDA kernel of minichain with NVRTC, without a GPU.
#
#   .ci/cuda_check.sh [12] [13]      (default: both; `make cuda-check`)
#
# For each CUDA major, builds .venv-cuda<major> from
# tests/cuda/requirements-cuda<major>.txt (CuPy, NVRTC, the CUDA headers and
# NCCL from PyPI; rebuilt when that file changes), prints its install time
# and size, and runs tests/cuda: each kernel through CuPy's own code
# generator for sm_80 and sm_90 in float16/32/64 with 32- and 64-bit
# indexing, a planted syntax error that must be rejected, and every
# cupy / cupy.cuda.nccl / cupy.cuda.runtime name the code uses.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ $# -eq 0 ]; then MAJORS=(12 13); else MAJORS=("$@"); fi
for major in "${MAJORS[@]}"; do
    reqs="tests/cuda/requirements-cuda${major}.txt"
    venv=".venv-cuda${major}"
    [ -f "$reqs" ] || { echo "cuda_check: no $reqs" >&2; exit 2; }
    stamp="$venv/.installed"
    if ! { [ -f "$stamp" ] && cmp -s "$stamp" "$reqs"; }; then
        rm -rf "$venv"
        start=$SECONDS
        "$PYTHON" -m venv "$venv"
        "$venv/bin/python" -m pip install -q --upgrade pip
        "$venv/bin/python" -m pip install -q -r "$reqs"
        cp "$reqs" "$stamp"
        echo "cuda_check: $venv installed in $((SECONDS - start)) s," \
             "$(du -sh "$venv" | cut -f1)"
    fi
    "$venv/bin/python" -W ignore -c 'import cupy
print("cuda_check: CuPy", cupy.__version__, "NVRTC", cupy.cuda.nvrtc.getVersion())'
    start=$SECONDS
    # minichain from this tree (python -m pytest puts it on sys.path)
    PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -q \
        -p no:cacheprovider tests/cuda
    echo "cuda_check: CUDA $major: tests/cuda took $((SECONDS - start)) s"
done
