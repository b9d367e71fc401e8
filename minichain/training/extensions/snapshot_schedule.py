"""Snapshots between epochs, for jobs that a batch system may kill without
warning: the newest snapshot is then at most ``every`` old.

``extend_snapshots`` adds a snapshot extension on a base trigger (every
epoch, say; those snapshots stay, as its ``n_retains`` allows) and every
``N`` iterations or ``N`` seconds of training in between; each of those in
between replaces the previous one, so that frequent snapshots do not fill
the disk::

    every = extensions.parse_interval('30m')      # or '500': iterations
    snap = extensions.snapshot(filename='snapshot_iter_{.updater.iteration}')
    extensions.extend_snapshots(trainer, snap, 'snapshot_iter_{.updater.'
                                'iteration}', (1, 'epoch'), every)

With a communicator (and ``dist.multi_node_snapshot``) every rank takes the
snapshot at the same iteration: a time interval is measured on rank 0.
"""
import argparse
import contextlib
import os
import time

from minichain.training import extension
from minichain.training.extensions._snapshot_files import stale_temporaries
from minichain.training.triggers import get_trigger

__all__ = ['PrunePeriodic', 'SnapshotSchedule', 'extend_snapshots',
           'parse_interval']

_UNITS = {'': 0, 'i': 0, 's': 1, 'm': 60, 'h': 3600}


def parse_interval(text):
    """``'N'`` (or ``'Ni'``) iterations, or ``'Ns'``, ``'Nm'``, ``'Nh'``
    seconds, minutes, hours of training, as ``(N, 'iteration')`` or
    ``(seconds, 'second')``. Raises ``argparse.ArgumentTypeError`` (a
    ``--snapshot-every`` option can use it as its ``type``)."""
    text = str(text).strip().lower()
    number, unit = text.rstrip('ismh'), text[len(text.rstrip('ismh')):]
    try:
        value = float(number)
    except ValueError:
        value = None
    if unit not in _UNITS or value is None or not value > 0 or (
            not _UNITS[unit] and value != int(value)):
        raise argparse.ArgumentTypeError(
            'expected a whole number of iterations (500) or a time such as '
            '90s, 30m or 2h, got {!r}'.format(text))
    if not _UNITS[unit]:
        return int(value), 'iteration'
    return value * _UNITS[unit], 'second'


class SnapshotSchedule:
    """The trigger of ``extend_snapshots``: ``base`` (None: never), and every
    ``every`` (from :func:`parse_interval`) in between.

    A time interval is measured on rank 0 and broadcast (a tiny collective
    per iteration: every rank must take the snapshot together). It is
    stateful, so call it once per iteration; after a firing, ``periodic``
    says whether ``every`` alone caused it.

    Args:
        base: a trigger or ``(period, unit)``, or None.
        every: ``(N, 'iteration')``, ``(seconds, 'second')`` or None.
        comm: a minichain.dist communicator, or None in one process.
    """

    def __init__(self, base, every=None, comm=None):
        self.base = get_trigger(base) if base else None
        self.every, self.comm = every, comm
        self.periodic = self.fired = False
        self._since = None

    def __call__(self, trainer):
        regular = bool(self.base and self.base(trainer))
        due = False
        if self.every and self.every[1] == 'iteration':
            due = trainer.updater.iteration % self.every[0] == 0
        elif self.every:
            now = time.monotonic()
            if self._since is None:
                self._since = now
            due = now - self._since >= self.every[0]
            if self.comm is not None:
                due = self.comm.bcast_obj(due, 0)
            if due or regular:
                self._since = now
        self.periodic = due and not regular
        self.fired = regular or due
        return self.fired


class PrunePeriodic(extension.Extension):
    """After a snapshot is written, remove the previous one that only
    ``SnapshotSchedule.every`` asked for (snapshots of ``base``, of the end
    and of a stop stay). Runs after the snapshot extension in the same
    iteration, on the writing rank."""

    priority = extension.PRIORITY_SNAPSHOT - 1

    def __init__(self, schedule, snap, filename):
        self.schedule, self.snap, self.filename = schedule, snap, filename
        self._previous = None

    def __call__(self, trainer):
        if self.snap.last_iteration != trainer.updater.iteration:
            return  # no snapshot in this iteration
        path = os.path.join(trainer.out, self.filename.format(trainer))
        if self._previous not in (None, path):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._previous)
        self._previous = path if self.schedule.periodic else None


def extend_snapshots(trainer, snap, filename, base, every=None, comm=None,
                     before=None, remove_stale=True):
    """Extend ``trainer`` with the snapshot extension ``snap`` (writing
    ``filename``, a pattern formatted with the trainer) on ``base`` and
    every ``every`` in between; see :class:`SnapshotSchedule`.

    Args:
        trainer: the Trainer (every rank's, with a communicator).
        snap: ``extensions.snapshot(...)``, or in a data-parallel job
            ``dist.multi_node_snapshot(comm, ...)``; it needs
            ``last_iteration``.
        filename: its file name pattern.
        base: when snapshots are kept, e.g. ``(1, 'epoch')``, or None.
        every: from :func:`parse_interval`, or None.
        comm: a minichain.dist communicator, or None in one process.
        before: an extension of higher priority than the snapshot (a check
            that may stop training) run on the same firings, just before.
        remove_stale: remove the temporary files that interrupted writes of
            ``filename`` left in ``trainer.out`` (those whose writer no
            longer runs).
    Returns:
        The SnapshotSchedule.
    """
    schedule = SnapshotSchedule(base, every, comm)
    if before is None:
        trainer.extend(snap, trigger=schedule)
    else:  # the schedule is stateful: evaluate it once per iteration
        trainer.extend(before, trigger=schedule)
        trainer.extend(snap, trigger=lambda t: schedule.fired)
    if comm is None or comm.rank == 0:
        for path in (stale_temporaries(trainer.out, [filename])
                     if remove_stale else ()):
            with contextlib.suppress(OSError):
                os.remove(path)
        if every:
            trainer.extend(PrunePeriodic(schedule, snap, filename),
                           trigger=(1, 'iteration'))
    return schedule
