"""Which ``mpiexec`` to run, and with which arguments: one setting for all.

The test helpers, the pytest plugin, the benchmarks and the Makefile all
start MPI jobs through :func:`mpiexec_command`, so one environment variable
chooses the launcher everywhere:

* ``MINICHAIN_MPIEXEC``: the launcher command, split like a shell line
  (``"mpirun --oversubscribe"``, ``"srun --mpi=pmix"``). Default: the
  ``mpiexec`` beside this Python (the MPICH wheel of the ``mpi`` extra),
  else ``mpiexec`` on ``PATH``.
* ``MINICHAIN_MPIEXEC_ARGS``: extra arguments put after the launcher and
  before ``-n`` (e.g. ``"--mca btl self,vader"``).

Open MPI's ``mpirun`` refuses more ranks than cores and runs as root only
when asked; minichain's own tests use more ranks than CI's two cores, so
:func:`mpiexec_command` adds ``--oversubscribe`` (and, as root,
``--allow-run-as-root``) for Open MPI unless ``oversubscribe=False``.
"""
import functools
import os
import shlex
import shutil
import subprocess
import sys

ENV = 'MINICHAIN_MPIEXEC'
ENV_ARGS = 'MINICHAIN_MPIEXEC_ARGS'

INSTALL_HINT = (
    'no mpiexec found: install the MPICH wheel beside this Python '
    '(pip install "minichain[mpi]", or pip install mpi4py mpich), or set '
    '{}="mpirun" (plus any arguments) to use your cluster\'s MPI'
    .format(ENV))


class LauncherNotFound(RuntimeError):
    """No MPI launcher could be found (the message says how to get one)."""


def find_mpiexec():
    """The launcher as an argument list, or None when none is found.

    ``$MINICHAIN_MPIEXEC`` wins; then ``mpiexec`` beside ``sys.executable``;
    then ``mpiexec`` on ``PATH``.
    """
    configured = os.environ.get(ENV, '').strip()
    if configured:
        return shlex.split(configured)
    here = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    if os.path.exists(here):
        return [here]
    found = shutil.which('mpiexec')
    return [found] if found else None


@functools.lru_cache(maxsize=None)
def _flavor_of(program):
    try:
        out = subprocess.run([program, '--version'], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 'unknown'
    text = (out.stdout + out.stderr).lower()
    if 'open mpi' in text or 'open-mpi' in text or 'openrte' in text:
        return 'openmpi'
    if 'hydra' in text or 'mpich' in text:
        return 'mpich'
    return 'unknown'


def flavor(launcher=None):
    """``'mpich'``, ``'openmpi'`` or ``'unknown'`` for a launcher list
    (default :func:`find_mpiexec`'s), from its ``--version`` output."""
    launcher = launcher or find_mpiexec()
    if not launcher:
        return 'unknown'
    return _flavor_of(launcher[0])


def mpiexec_command(n, oversubscribe=True, quiet=True):
    """The argument list that starts ``n`` ranks: append the program.

    Args:
        n: number of ranks.
        oversubscribe: for Open MPI, allow more ranks than cores (and run
            as root when this process is root).
        quiet: for Open MPI, ``-q`` (drops its "Primary job terminated
            normally, but..." banner, which would mix into the ranks'
            output).
    Raises:
        LauncherNotFound: with what to install or set.
    """
    launcher = find_mpiexec()
    if launcher is None:
        raise LauncherNotFound(INSTALL_HINT)
    cmd = list(launcher)
    if flavor(launcher) == 'openmpi':
        if oversubscribe:
            cmd.append('--oversubscribe')
            if hasattr(os, 'geteuid') and os.geteuid() == 0:
                cmd.append('--allow-run-as-root')
        if quiet:
            cmd.append('-q')
    cmd += shlex.split(os.environ.get(ENV_ARGS, ''))
    return cmd + ['-n', str(int(n))]
