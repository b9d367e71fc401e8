"""Checks of models/train_resnet50.py: nothing starts that cannot finish.

Options are finite and in range before anything else; ``--out`` is a
writable folder with room for a snapshot before any work (nothing is
written until training starts); a resumed run has the settings of the run
that wrote the snapshot; a parameter that is inf or NaN stops training
before it reaches a snapshot. Every failure is a :class:`UserError`: one
line on stderr, printed by rank 0 once every rank has it (:func:`agree`).
"""
import argparse
import json
import math
import os
import shutil
import tempfile
import zlib

import numpy

from minichain import dist
from minichain.dist.optimizers import all_finite
from minichain.training import extension
from minichain.training.extensions._snapshot_files import stale_temporaries

SNAPSHOT = 'snapshot_iter_{.updater.iteration}'
# The files rank 0 writes under --out whose interrupted writes are ours.
OUTPUTS = (SNAPSHOT, 'log', 'loss.png', 'accuracy.png', 'graph.dot')
# What a resumed run must share with the run that wrote its snapshot.
SETTINGS = ('batchsize', 'seed', 'bn', 'data', 'data_dir', 'train_subset',
            'val_subset', 'image_size', 'arch', 'stem', 'time_budget')


class UserError(Exception):
    """Bad input: printed as one line (by rank 0), exit with ``status``."""

    def __init__(self, message, status=1):
        super().__init__(' '.join(str(message).split()))
        self.status = status


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one-line UserErrors (status 2),
    printed by rank 0 alone, without the usage block."""

    def error(self, message):
        raise UserError(message, status=2)


def agree(comm, fn, *args):
    """``fn(*args)`` on every rank; a UserError on any rank is raised on all
    (naming the rank when it is not rank 0), so that no rank hangs."""
    try:
        result, error = fn(*args), None
    except UserError as e:
        result, error = None, (str(e), e.status)
    errors = comm.allgather_obj(error)
    for rank, err in enumerate(errors):
        if err is not None:
            prefix = '' if rank == 0 else '[rank {}] '.format(rank)
            raise UserError(prefix + err[0], status=err[1])
    return result


def on_root(comm, fn, *args):
    """``fn(*args)`` on rank 0 (the writer), agreed on by every rank."""
    return agree(comm, lambda: fn(*args) if comm.rank == 0 else None)


def launcher_rank():
    """This process's rank as the MPI launcher tells it (before MPI starts),
    0 when not launched by mpiexec."""
    for var in ('PMI_RANK', 'OMPI_COMM_WORLD_RANK', 'PMIX_RANK'):
        if os.environ.get(var, '').isdigit():
            return int(os.environ[var])
    return 0


# -- options ------------------------------------------------------------------
def check_args(args):
    """Refuse option values out of range (the same on every rank); options
    a script does not have are skipped (train_resnet50.py, train_mnist.py)."""
    for name in ('batchsize', 'val_batchsize', 'iteration', 'train_subset',
                 'val_subset', 'image_size', 'keep', 'unit'):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UserError('--{} must be at least 1, got {}'.format(
                name.replace('_', '-'), value), status=2)
    # name: (low, high, low excluded); every value must also be finite
    for name, (low, high, low_open) in {
            'epoch': (0, None, True), 'time_budget': (0, None, True),
            'lr': (0, None, True),
            'warmup': (0, None, False), 'momentum': (0, 1, False),
            'weight_decay': (0, None, False),
            'bucket_mb': (0, None, True)}.items():
        value = getattr(args, name, None)
        if value is not None:
            number(value, name.replace('_', '-'), low, high, low_open)
    number(args.seed, 'seed', 0, 2 ** 32, integer=True)
    epoch = getattr(args, 'epoch', None)
    if epoch is not None and epoch > 10 ** 6:
        raise UserError('--epoch {} is more than a million epochs'.format(
            epoch), status=2)
    jobs = getattr(args, 'loaderjob', None)
    if jobs is not None and jobs < 0:
        raise UserError('--loaderjob must be at least 0, got {}'.format(
            jobs), status=2)
    if jobs is not None and jobs > loaderjob_limit():
        raise UserError(
            '--loaderjob {} is more than this machine allows: each worker '
            'holds {} file descriptors in its rank (a training and a '
            'validation iterator) and the open-file limit is {} (ulimit -n), '
            'so at most {}'.format(jobs, FDS_PER_LOADER,
                                   _open_file_limit(), loaderjob_limit()),
            status=2)


# File descriptors a loader worker holds in its rank: about 3 for each of
# the two iterators (its pipe, its process sentinel, its share of the
# shared-memory blocks), counted in /proc/self/fd; and those kept for the
# rest (MPI, the data, the snapshots).
FDS_PER_LOADER = 6
FDS_RESERVED = 256


def _open_file_limit():
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # not POSIX
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def loaderjob_limit():
    """The most ``--loaderjob`` workers a rank can open files for."""
    limit = _open_file_limit()
    if limit is None:
        return math.inf
    return max(0, (limit - FDS_RESERVED) // FDS_PER_LOADER)


def number(text, name, low=None, high=None, low_open=False, integer=False):
    """``text`` as a finite float (or int) in ``[low, high)`` (``(low,
    high)`` with ``low_open``); a UserError naming ``--name`` otherwise."""
    try:
        value = int(text) if integer else float(text)
    except (TypeError, ValueError):
        raise UserError('--{}: expected {}, got {!r}'.format(
            name, 'an integer' if integer else 'a number', text), status=2)
    ok = math.isfinite(value) and (low is None or value > low or (
        value == low and not low_open)) and (high is None or value < high)
    if not ok:
        if low is not None and high is not None:
            want = 'in {}{}, {})'.format('(' if low_open else '[', low, high)
        elif low is not None:
            want = '{} {}'.format('>' if low_open else '>=', low)
        else:
            want = 'finite'
        raise UserError('--{} must be {}, got {}'.format(name, want, text),
                        status=2)
    return value


# -- --out --------------------------------------------------------------------
def check_out(out):
    """Refuse an ``--out`` that cannot become a writable folder, without
    creating anything; returns the folder that exists (``out`` or its
    nearest existing parent)."""
    path = os.path.abspath(out)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError('--out {}: it is a file, not a folder'.format(out))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserError('--out {}: {} is a file, so no folder can be made '
                        'under it'.format(out, existing))
    try:  # a real write: permissions, read-only mounts, quotas
        fd, probe = tempfile.mkstemp(prefix='.write-probe-', dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError('--out {}: cannot write in {} ({})'.format(
            out, existing, e.strerror or e))
    return existing


def snapshot_bytes(model, optimizer_slots=1):
    """About how many bytes a snapshot of ``model`` takes (parameters, one
    array per optimizer slot and parameter, persistents)."""
    params = sum(p.array.nbytes for p in model.params() if p.array is not None)
    persistents = sum(getattr(v, 'nbytes', 8) for _, v in
                      model.namedpersistents())
    return params * (1 + optimizer_slots) + persistents


def check_free_space(out, need):
    """Refuse an ``--out`` whose file system cannot hold two snapshots of
    ``need`` bytes (a new one is written beside the last, which is removed
    only once the new one is complete), with a margin."""
    folder = check_out(out)
    free = shutil.disk_usage(folder).free
    if free < 2.1 * need + (1 << 20):
        raise UserError(
            '--out {}: {:.1f} MB free on its file system, but a snapshot of '
            'this model takes about {:.1f} MB, and one is written beside the '
            'last; free some space or choose another --out'.format(
                out, free / 2 ** 20, need / 2 ** 20))


def remove_stale_temporaries(out):
    """Delete what interrupted writes of this script left in ``out`` (by
    name: ``.snapshot_iter_6.<pid>.tmp`` and the like, of processes that no
    longer run); returns their paths."""
    found = stale_temporaries(out, OUTPUTS)
    for path in found:
        try:
            os.unlink(path)
        except OSError:
            pass
    return found


def last_snapshot(out):
    """The newest snapshot file in ``out`` (by iteration), or None."""
    try:
        names = os.listdir(out)
    except OSError:
        return None
    found = [(int(n.rsplit('_', 1)[1]), n) for n in names
             if n.startswith('snapshot_iter_') and n.rsplit('_', 1)[1]
             .isdigit()]
    return os.path.join(out, max(found)[1]) if found else None


# -- what a resumed run must share with the one that wrote the snapshot -------
def settings(args, fingerprint):
    """The run's settings (:data:`SETTINGS` and a fingerprint of the
    training data) as a dict."""
    out = {k: getattr(args, k, None) for k in SETTINGS}
    out['data_dir'] = os.path.abspath(out['data_dir']) if out[
        'data_dir'] else None
    out['data fingerprint'] = fingerprint
    return out


def fingerprint(*arrays):
    """A short hash of arrays (the training labels, say): equal data, equal
    text."""
    crc = 0
    for a in arrays:
        a = numpy.ascontiguousarray(a)
        crc = zlib.crc32(repr((a.shape, a.dtype.str)).encode(), crc)
        crc = zlib.crc32(a.view(numpy.uint8).reshape(-1), crc)
    return '{:08x}'.format(crc)


class RunSettings(extension.Extension):
    """Stores the run's settings in every snapshot (``never`` triggered)."""

    trigger = (10 ** 9, 'iteration')
    name = 'run_settings'
    key = 'extensions/run_settings/settings'

    def __init__(self, values):
        self.values = values

    def __call__(self, trainer):
        pass

    def serialize(self, serializer):
        serializer('settings', json.dumps(self.values, sort_keys=True))


def check_resume(path, current):
    """Refuse a snapshot written with other settings, naming the old and new
    values (rank 0 reads ``path``; a snapshot without settings passes)."""
    try:
        with numpy.load(path, allow_pickle=False) as npz:
            if RunSettings.key not in npz:
                return
            stored = json.loads(str(npz[RunSettings.key]))
    except Exception:  # noqa: BLE001 - the snapshot loader reports it
        return
    diffs = ['{} {} (this run: {})'.format(_flag(k), _show(stored.get(k)),
                                           _show(current.get(k)))
             for k in sorted(set(stored) | set(current))
             if stored.get(k) != current.get(k)]
    if diffs:
        raise UserError('--resume {} was written with {}; resume with the '
                        'same settings (or start afresh in another --out)'
                        .format(path, '; '.join(diffs)))


def resume(comm, snap, path, trainer, current):
    """Load the snapshot ``path`` into ``trainer`` on every rank, after
    refusing one written with other settings than ``current``."""
    on_root(comm, check_resume, path, current)

    def load():
        try:
            snap.load(path, trainer)
        except ValueError as e:  # raised on every rank alike
            raise UserError(str(e))
    agree(comm, load)


def _flag(key):
    return 'the training data' if key == 'data fingerprint' else \
        '--' + key.replace('_', '-')


def _show(value):
    return 'unset' if value is None else value


class FiniteGuard(extension.Extension):
    """Stops training with one line, on every rank, when a parameter or a
    persistent value holds inf or NaN, before the snapshot of the same
    trigger writes it (``--nan-check off`` lets NaN reach the weights)."""

    priority = extension.PRIORITY_SNAPSHOT + 1

    def __init__(self, comm, out):
        self.comm, self.out = comm, out

    def __call__(self, trainer):
        model = trainer.updater.get_optimizer('main').target
        arrays = [p.array for p in model.params()] + [
            v for _, v in model.namedpersistents() if hasattr(v, 'dtype')
            and v.dtype.kind == 'f']
        if self.comm.allreduce_obj(int(not all_finite(arrays)), 'max'):
            raise UserError(
                'iteration {}: the model holds inf or NaN, so no snapshot was '
                'written; {}'.format(trainer.updater.iteration,
                                     describe_last(self.out)))


def describe_last(out):
    """``'the last good snapshot is OUT/snapshot_iter_N'`` or that there is
    none."""
    last = last_snapshot(out)
    return ('the last good snapshot is {}'.format(last) if last else
            'no snapshot was written')


def run(trainer, comm, out):
    """``trainer.run()``; an error that one rank meets (an unreadable batch)
    is raised on every rank, and a non-finite gradient or a file that
    cannot be written (a snapshot, a plot) stops training with one line."""
    try:
        trainer.run()
    except UserError as e:
        if not getattr(e, 'raised_on_every_rank', False):
            comm.raise_everywhere(e)
        raise
    except dist.NonFiniteGradientError as e:
        raise UserError('{}; {}'.format(e, describe_last(out)))
    except OSError as e:  # a snapshot or a plot rank 0 could not write
        if not getattr(e, 'raised_on_every_rank', False):
            try:  # the others meet it at their next collective
                comm.raise_everywhere(e)
            except OSError as everywhere:
                e = everywhere
        raise UserError('{}; {}'.format(e, describe_last(out)))
