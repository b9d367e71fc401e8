"""Which ``mpiexec`` to run, and with which arguments: one setting for all.

The test helpers, the pytest plugin, the benchmarks and the Makefile all
start MPI jobs through :func:`mpiexec_command`, so one environment variable
chooses the launcher everywhere:

* ``MINICHAIN_MPIEXEC``: the launcher command, split like a shell line
  (``"mpirun"``, ``"/opt/openmpi/bin/mpirun --mca btl self,vader"``,
  ``"srun --mpi=pmix"``). Default: the ``mpiexec`` beside this Python (the
  MPICH wheel of the ``mpi`` extra), else ``mpiexec`` on ``PATH``.
* ``MINICHAIN_MPIEXEC_ARGS``: extra arguments put after the launcher's own
  and before ``-n`` (e.g. ``"--mca odls_base_sigkill_timeout 30"``).

Open MPI's ``mpirun`` refuses more ranks than cores and runs as root only
when asked; minichain's own tests use more ranks than CI's two cores, so
:func:`mpiexec_command` adds ``--oversubscribe`` (and, as root,
``--allow-run-as-root``) for Open MPI, ``--overcommit`` for Slurm's
``srun``, unless ``oversubscribe=False``.

What the launchers do with a signal (models/README.md, "Pre-emption:
what each launcher does with a signal"):

* MPICH's Hydra ``mpiexec`` hands SIGTERM, SIGINT and SIGUSR1 to every
  rank at once, waits for the ranks however long they take, and exits with
  their status (128 + the signal when the ranks return it, as minichain's
  training scripts do). SIGUSR2 ends Hydra and the job at once.
* ``scancel --signal=SIG`` (and ``sbatch --signal``) signal every rank of a
  job step started by ``srun`` directly; nothing kills them afterwards, and
  ``srun`` exits with their status.
* Open MPI's ``mpirun`` hands SIGUSR1 and SIGUSR2 on at once and waits, but
  on SIGTERM or SIGINT it sends the ranks SIGCONT, then SIGTERM
  ``odls_base_sigkill_timeout`` seconds later (default 1), then SIGKILL as
  long again after that, and exits 1 whatever the ranks return. ``grace``
  (below) lengthens that timeout.

Run as a program, this module starts the command under the launcher::

    python -m minichain.dist.launcher -n 2 python -m models.train_resnet50
    python -m minichain.dist.launcher -n 2 --print python x.py  # just show it
"""
import argparse
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
    '(pip install mpi4py mpich; in a minichain checkout, pip install -e '
    '".[mpi]"), or set '
    '{}="mpirun" (plus any arguments) to use your cluster\'s MPI'
    .format(ENV))


class LauncherNotFound(RuntimeError):
    """No MPI launcher could be found (the message says how to get one)."""


def find_mpiexec(python=None):
    """The launcher as an argument list, or None when none is found.

    ``$MINICHAIN_MPIEXEC`` wins; then ``mpiexec`` beside ``python``
    (default ``sys.executable``: a venv's MPICH wheel); then ``mpiexec`` on
    ``PATH``.
    """
    configured = os.environ.get(ENV, '').strip()
    if configured:
        return shlex.split(configured)
    here = os.path.join(os.path.dirname(python or sys.executable), 'mpiexec')
    if os.path.exists(here):
        return [here]
    found = shutil.which('mpiexec')
    return [found] if found else None


@functools.lru_cache(maxsize=None)
def _flavor_of(program):
    if os.path.basename(program) == 'srun':  # needs a cluster to say more
        return 'slurm'
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
    if 'slurm' in text:
        return 'slurm'
    return 'unknown'


def flavor(launcher=None):
    """``'mpich'``, ``'openmpi'``, ``'slurm'`` (``srun``) or ``'unknown'``
    for a launcher list (default :func:`find_mpiexec`'s), from its name and
    its ``--version`` output."""
    launcher = launcher or find_mpiexec()
    if not launcher:
        return 'unknown'
    return _flavor_of(launcher[0])


def mpiexec_command(n, oversubscribe=True, quiet=True, grace=None,
                    python=None):
    """The argument list that starts ``n`` ranks: append the program.

    Args:
        n: number of ranks.
        oversubscribe: allow more ranks than cores (Open MPI:
            ``--oversubscribe``, and ``--allow-run-as-root`` when this
            process is root; ``srun``: ``--overcommit``).
        quiet: Open MPI's ``-q`` (drops its "Primary job terminated
            normally, but..." banner, which would mix into the ranks'
            output).
        grace: seconds the ranks get to stop after the launcher is sent
            SIGTERM or SIGINT. Only Open MPI's ``mpirun`` needs it
            (``--mca odls_base_sigkill_timeout``; its default is 1 s, and it
            also delays the ranks' SIGTERM by as long); the other launchers
            wait for the ranks anyway.
        python: find the default ``mpiexec`` beside this interpreter
            instead of ``sys.executable``.
    Raises:
        LauncherNotFound: with what to install or set.
    """
    launcher = find_mpiexec(python)
    if launcher is None:
        raise LauncherNotFound(INSTALL_HINT)
    if shutil.which(launcher[0]) is None:
        configured = os.environ.get(ENV, '').strip()
        raise LauncherNotFound('{}={!r}: no such program ({}); {}'.format(
            ENV, configured, launcher[0], INSTALL_HINT) if configured
            else INSTALL_HINT)
    cmd = list(launcher)
    kind = flavor(launcher)
    if kind == 'openmpi':
        if oversubscribe:
            cmd.append('--oversubscribe')
            if hasattr(os, 'geteuid') and os.geteuid() == 0:
                cmd.append('--allow-run-as-root')
        if quiet:
            cmd.append('-q')
        if grace is not None:
            cmd += ['--mca', 'odls_base_sigkill_timeout',
                    str(max(1, int(round(grace))))]
    elif kind == 'slurm' and oversubscribe:
        cmd.append('--overcommit')
    cmd += shlex.split(os.environ.get(ENV_ARGS, ''))
    return cmd + ['-n', str(int(n))]


def main(argv=None):
    """``python -m minichain.dist.launcher -n N PROGRAM...``: run PROGRAM
    as N ranks under the launcher (the launcher replaces this process, so
    that signals sent to it reach the launcher itself)."""
    p = argparse.ArgumentParser(
        prog='python -m minichain.dist.launcher',
        description='Run a program as N MPI ranks under the launcher that '
        '${} chooses (default: the mpiexec beside this Python).'.format(ENV))
    p.add_argument('-n', '--np', type=int, required=True, dest='n')
    p.add_argument('--grace', type=float, help='seconds the ranks get to '
                   'stop on SIGTERM/SIGINT (Open MPI\'s mpirun only)')
    p.add_argument('--print', action='store_true', dest='show',
                   help='print the command instead of running it')
    p.add_argument('program', nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.n < 1 or not args.program:
        p.error('give -n N (at least 1) and the program to run')
    try:
        cmd = mpiexec_command(args.n, grace=args.grace) + args.program
    except LauncherNotFound as e:
        p.exit(1, '{}: error: {}\n'.format(p.prog, e))
    if args.show:
        print(shlex.join(cmd))
        return 0
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)


if __name__ == '__main__':
    sys.exit(main())
