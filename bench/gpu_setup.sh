#!/usr/bin/env bash
# bench/gpu_check.sh's setup stage: make MPI usable on a lent GPU machine
# without a registry, from wheels carried with the working tree.
#
#   bench/gpu_setup.sh PYTHON WORK WHEELS
#
# When PYTHON imports mpi4py.MPI (an MPI library found) and minichain's
# launcher finds an mpiexec, nothing is done. Otherwise, when WHEELS holds
# the wheels of bench/gpu_wheels.sh, pip installs mpi4py and MPICH from
# there alone (--no-index) under the prefix WORK/mpi, and WORK/env gets
# the variables that make them found (PYTHONPATH first, so that they
# shadow an mpi4py without its MPI library; MPI4PY_LIBMPI;
# MINICHAIN_MPIEXEC), for gpu_check to source. Exit 0 in both cases: a
# stage that needs MPI says what is missing.
set -uo pipefail
PY="$1" WORK="$2" WHEELS="$3"
mpi_ok() {
    "$PY" -W ignore -c '
import mpi4py.MPI
from minichain.dist import launcher
raise SystemExit(0 if launcher.find_mpiexec() else 1)' >/dev/null 2>&1
}
if mpi_ok; then
    echo "setup: mpi4py and an mpiexec are here: nothing to install"
    exit 0
fi
if ! ls "$WHEELS"/mpich-*.whl >/dev/null 2>&1; then
    echo "setup: MPI is missing and no wheels were carried ($WHEELS): run" \
         "bench/gpu_wheels.sh before the loan and carry bench/wheels"
    exit 0
fi
PREFIX="$WORK/mpi"
"$PY" -m pip install -q --no-index --find-links "$WHEELS" --prefix "$PREFIX" \
    --ignore-installed mpi4py mpich || {
    echo "setup: pip could not install the carried wheels"; exit 0; }
SITE=$("$PY" -c 'import sysconfig, sys
print(sysconfig.get_path("platlib", vars={"platbase": sys.argv[1],
                                          "base": sys.argv[1]}))' "$PREFIX")
LIBMPI=$(ls "$PREFIX"/lib/libmpi.so.* 2>/dev/null | head -1)
cat > "$WORK/env" <<VARS
export PYTHONPATH="$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
export MPI4PY_LIBMPI="$LIBMPI"
export MINICHAIN_MPIEXEC="$PREFIX/bin/mpiexec"
export PATH="$PREFIX/bin:\$PATH"
VARS
. "$WORK/env"
if mpi_ok; then
    echo "setup: installed mpi4py and MPICH from $WHEELS under $PREFIX:" \
         "$("$PY" -W ignore -c 'import mpi4py.MPI as M
print(M.Get_library_version().splitlines()[0])')"
else
    echo "setup: installed the carried wheels, but mpi4py still fails:"
    "$PY" -W ignore -c 'import mpi4py.MPI' 2>&1 | tail -1
fi
