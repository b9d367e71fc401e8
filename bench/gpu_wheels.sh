#!/usr/bin/env bash
# Download here, before a GPU loan, the wheels a lent machine may lack and
# cannot download (it reaches no registry): MPICH and mpi4py, for which
# bench/gpu_check.sh's setup stage looks in bench/wheels.
#
#   bench/gpu_wheels.sh [DIR]        (default bench/wheels, ignored by git)
#
# then carry the folder with the working tree (the device tool's
# carry=["bench/wheels"]; at most 64 MiB travel in all): mpich's wheel is
# 13 MB, mpi4py's 1.4 MB for each CPython 3.10-3.14 (the device's Python
# version is not known here). NCCL (200 MB), cuBLAS (440 MB) and cuDNN
# (520 MB) are far too large to carry: the device's PyTorch brings its
# own, which CuPy and minichain's cuDNN kernels find (gpu_check says so).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-bench/wheels}"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
MPICH=5.0.2       # the versions `make test` installs (pyproject's mpi extra)
MPI4PY=4.1.2
LIMIT_MIB=48      # leaves room in the 64 MiB carried for the working tree
mkdir -p "$DIR"
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$p")
done
get() {
    "$PY" -m pip download -q --no-deps --only-binary=:all: \
        "${PLATFORMS[@]}" -d "$DIR" "$@"
}
get "mpich==$MPICH"
for v in 310 311 312 313 314; do
    get --python-version "$v" "mpi4py==$MPI4PY" ||
        echo "gpu_wheels: no mpi4py $MPI4PY wheel for CPython $v" >&2
done
ls -l "$DIR"
mib=$(( $(du -sk "$DIR" | cut -f1) / 1024 ))
echo "gpu_wheels: $DIR holds ${mib} MiB (limit ${LIMIT_MIB} MiB)"
[ "$mib" -le "$LIMIT_MIB" ] || { echo "gpu_wheels: too large to carry" >&2; exit 1; }
