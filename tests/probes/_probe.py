"""Run a command as a user would, and see what it leaves behind.

:func:`probe` runs it in a subprocess (under ``python -m
minichain.dist.launcher -n N`` for N ranks) with a temp dir of its own
(``TMPDIR``, removed afterwards) and
``_site/sitecustomize.py`` in every Python process of the job, which notes
the shared-memory files the processes map and Hydra's topology file. The
:class:`Outcome` holds the exit status, the output, the lines that say
``error``, and ``left``: whatever the job created in its temp dir, plus
the noted files that still exist afterwards.
"""
import collections
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), '_site')

Outcome = collections.namedtuple(
    'Outcome', 'returncode out err errors left noted elapsed')


def probe(tmp_path, args, ranks=0, env=None, timeout=120):
    """Run ``python args...`` (on ``ranks`` ranks when given) from the
    repository root; returns an Outcome. A job still running at
    ``timeout`` is killed (and the calling test fails on it)."""
    # The job's temp dir, short: a forkserver's socket lives in it, and
    # AF_UNIX paths end at 107 bytes (pytest's tmp_path can be longer).
    tmp = pathlib.Path(tempfile.mkdtemp(prefix='probe-', dir='/tmp' if
                                        os.path.isdir('/tmp') else None))
    record = tmp_path / 'probe-record'
    record.mkdir(exist_ok=True)
    try:
        return _run(cmd_of(args, ranks), env, timeout, tmp, record)
    finally:
        shutil.rmtree(str(tmp), ignore_errors=True)


def cmd_of(args, ranks):
    """``python args...``, under the launcher for ``ranks`` ranks."""
    cmd = [sys.executable] + [str(a) for a in args]
    if ranks:
        cmd = [sys.executable, '-m', 'minichain.dist.launcher', '-n',
               str(ranks)] + cmd
    return cmd


def _run(cmd, env, timeout, tmp, record):
    path = os.pathsep.join([SITE, ROOT] + [
        p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p])
    full = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=path,
                PROBE_RECORD=str(record), OMP_NUM_THREADS='1',
                OPENBLAS_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    full.pop('MINICHAIN_NO_ABORT', None)
    full.update(env or {})
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError('{} still ran after {} s:\n{}\n{}'.format(
            cmd, timeout, out, err))
    elapsed = time.monotonic() - start
    time.sleep(0.2)  # the launcher's own cleanup, after the ranks
    noted = set()
    for name in os.listdir(str(record)):
        noted |= set((record / name).read_text().split())
    left = sorted(str(p) for p in tmp.rglob('*')) + sorted(
        p for p in noted if os.path.exists(p))
    errors = [line for line in (out + err).splitlines()
              if 'error' in line.lower()]
    return Outcome(proc.returncode, out, err, errors, left, noted, elapsed)


def assert_one_line(outcome, *words):
    """Exit status not 0, exactly one line saying ``error`` (it holds each
    of ``words``), no traceback, nothing left behind."""
    text = outcome.out + outcome.err
    assert outcome.returncode != 0, text
    assert 'Traceback' not in text, text
    assert len(outcome.errors) == 1, text
    for word in words:
        assert word in outcome.errors[0], (word, text)
    assert not outcome.left, (outcome.left, text)


def assert_mpich_files_noted(outcome):
    """The watcher saw the job's MPICH segment and Hydra's topology file
    (under MPICH; so that 'nothing left' means something)."""
    from minichain.dist import launcher
    if launcher.flavor() != 'mpich':
        return
    text = outcome.out + outcome.err
    assert any(p.startswith('/dev/shm/mpich_shm_') for p in outcome.noted), (
        outcome.noted, text)
    assert any('hydra_hwloc_xmlfile_' in p for p in outcome.noted), (
        outcome.noted, text)
