"""Trainer pieces of models/train_resnet50.py.

``TimedUpdater`` (images per second, reproducible augmentation),
``LearningRate`` (warm-up then decay, stateless), ``StopOnSignal`` (the
stop trigger that lets all ranks stop together on a stop signal),
``SnapshotSchedule`` (``--snapshot-every``) and ``Progress`` (rank 0's
bar).
"""
import argparse
import contextlib
import math
import os
import signal
import sys
import time

from minichain import backend, training
from minichain.dist import watchdog
from minichain.training import extension
from minichain.training.extensions._snapshot_files import stale_temporaries


class TimedUpdater(training.StandardUpdater):
    """StandardUpdater that times its updates (images per second) and
    reseeds the converter's augmentation from the iteration, so that a
    resumed run draws the same crops as an uninterrupted one."""

    def __init__(self, *args, images_per_update, seed, rank, **kwds):
        super().__init__(*args, **kwds)
        self.images_per_update = images_per_update
        self._seed = (seed, rank)
        self._images, self._seconds = 0, 0.0
        self.recent = []  # the last update times, for the progress bar

    def update_core(self):
        if hasattr(self.converter, 'reseed'):
            self.converter.reseed(self._seed + (self.iteration,))
        start = time.perf_counter()
        super().update_core()
        seconds = time.perf_counter() - start
        self._images += self.images_per_update
        self._seconds += seconds
        self.recent = (self.recent + [seconds])[-20:]

    def pop_images_per_sec(self):
        """Images per second (all ranks) since the last call."""
        rate = self._images / self._seconds if self._seconds else 0.0
        self._images, self._seconds = 0, 0.0
        return rate


class LearningRate(extension.Extension):
    """``lr(i)``: a linear warm-up from ``peak / 10`` over ``warmup``
    iterations (Goyal et al., 2017), then ``cosine`` (to 0), ``linear`` (to 0)
    or ``step`` (x0.1 at 1/3, 2/3 and 8/9 of training, their 30/60/80 of 90
    epochs) decay. A function of the iteration alone, so it needs no state in
    snapshots. It runs after the writers, so that ``observe_lr`` reports
    the rate the iteration used."""

    priority = extension.PRIORITY_READER

    def __init__(self, peak, warmup, total, schedule):
        self.peak, self.warmup, self.total = peak, warmup, max(total, 1)
        self.schedule = schedule

    def value(self, i):
        """The learning rate of iteration ``i + 1``."""
        if i < self.warmup:
            return self.peak * (0.1 + 0.9 * i / self.warmup)
        rest = min(1.0, (i - self.warmup) / max(1, self.total - self.warmup))
        if self.schedule == 'cosine':
            return self.peak * 0.5 * (1 + math.cos(math.pi * rest))
        if self.schedule == 'linear':
            return self.peak * (1 - rest)
        return self.peak * 0.1 ** sum(i >= self.total * f
                                      for f in (1 / 3, 2 / 3, 8 / 9))

    def initialize(self, trainer):
        trainer.updater.get_optimizer('main').lr = self.value(
            trainer.updater.iteration)

    def __call__(self, trainer):
        trainer.updater.get_optimizer('main').lr = self.value(
            trainer.updater.iteration)


# Signals that ask for a stop: SIGTERM (batch systems, kill), SIGINT
# (Ctrl-C) and SIGUSR1/SIGUSR2, which Open MPI's mpirun passes to the
# ranks without killing them a second later as it does on SIGTERM, and
# which Slurm's --signal and Grid Engine's -notify send ahead of a stop.
STOP_SIGNALS = tuple(getattr(signal, name) for name in (
    'SIGTERM', 'SIGINT', 'SIGUSR1', 'SIGUSR2') if hasattr(signal, name))

_caught = {'signum': 0, 'at': 0.0}  # the first stop signal, and when
# A stop signal repeated within this many seconds is one request delivered
# twice (by the scheduler and by the launcher), not a second request.
REPEAT_WINDOW = 1.0


def catch_signals():
    """From now on a stop signal (``STOP_SIGNALS``) only takes note
    (``StopOnSignal`` acts on it between iterations). After that, the
    process ends at once on a SIGINT (Ctrl-C again), or on any stop signal
    more than ``REPEAT_WINDOW`` seconds after the first (a second request),
    or on any stop signal once the process has made no progress through the
    collectives for longer than the stall timeout
    (``minichain.dist.watchdog.stalled``: it would never reach the next
    iteration). A repeated SIGTERM or SIGUSR within the window is the same
    request delivered twice (Slurm signals every process of a job step, and
    the launcher forwards what it got) and is ignored. Call it first
    thing."""
    def note(signum, frame):
        now = time.monotonic()
        again = _caught['signum'] and (
            signum == signal.SIGINT or now - _caught['at'] > REPEAT_WINDOW)
        if again or watchdog.stalled():
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        if not _caught['signum']:
            _caught['signum'], _caught['at'] = signum, now
    for s in STOP_SIGNALS:
        signal.signal(s, note)


class StopOnSignal:
    """The stop trigger: ``base`` or a signal caught by any rank (see
    ``catch_signals``).

    Every call agrees on the signal with one tiny allreduce, so all ranks
    stop after the same iteration; ``signum`` is then the signal."""

    def __init__(self, base, comm):
        self.base, self.comm = training.get_trigger(base), comm
        self.signum = 0

    def __call__(self, trainer):
        self.signum = self.comm.allreduce_obj(_caught['signum'], 'max')
        return bool(self.signum) or self.base(trainer)

    def get_training_length(self):
        return self.base.get_training_length()


# -- snapshots between epochs -------------------------------------------------
_UNITS = {'': 0, 'i': 0, 's': 1, 'm': 60, 'h': 3600}


def snapshot_interval(text):
    """``--snapshot-every``: ``N`` (or ``Ni``) iterations, or ``Ns``,
    ``Nm``, ``Nh`` seconds, minutes, hours of training. Returns
    ``(N, 'iteration')`` or ``(seconds, 'second')``."""
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
    """The snapshot's trigger: ``base`` (e.g. every epoch; None: never), and
    every ``every`` (from :func:`snapshot_interval`) in between, so that
    the newest snapshot is at most that old when the job is killed.

    A time interval is measured on rank 0 and broadcast (a tiny collective
    per iteration: every rank must take the snapshot together). After a
    firing, ``periodic`` says whether ``every`` alone caused it."""

    def __init__(self, base, every, comm):
        self.base = training.get_trigger(base) if base else None
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
            due = self.comm.bcast_obj(now - self._since >= self.every[0], 0)
            if due or regular:
                self._since = now
        self.periodic = due and not regular
        self.fired = regular or due
        return self.fired


class PrunePeriodic(extension.Extension):
    """Rank 0: after a snapshot is written, remove the previous one that
    only ``SnapshotSchedule.every`` asked for (snapshots of epochs, of the
    end and of a stop stay), so that frequent snapshots do not fill the
    disk. Runs after the snapshot extension in the same iteration."""

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


def extend_snapshots(trainer, snap, filename, base, every, comm,
                     before=None, remove_stale=True):
    """Extend ``trainer`` with the multi-node snapshot ``snap`` (written as
    ``filename``) on ``base`` and every ``every``; see SnapshotSchedule.

    ``before``, an extension of higher priority than the snapshot (a check
    that may stop training), runs on the same firings, just before it.
    Temporary files of interrupted writes are the training script's to
    remove (``train_checks.remove_stale_temporaries``: only those whose
    writer no longer runs)."""
    schedule = SnapshotSchedule(base, every, comm)
    if before is None:
        trainer.extend(snap, trigger=schedule)
    else:  # the schedule is stateful: evaluate it once per iteration
        trainer.extend(before, trigger=schedule)
        trainer.extend(snap, trigger=lambda t: schedule.fired)
    if comm.rank == 0:
        for path in (stale_temporaries(trainer.out, [filename])
                     if remove_stale else ()):
            with contextlib.suppress(OSError):
                os.remove(path)
        if every:
            trainer.extend(PrunePeriodic(schedule, snap, filename),
                           trigger=(1, 'iteration'))
    return schedule


class Progress(extension.Extension):
    """Rank 0's progress bar: loss, accuracy and images per second (tqdm
    when installed, else a line every ``interval`` iterations).

    The smoothed loss and accuracy stay where the model computes them (on
    the GPU, a CuPy scalar): reading one back waits for every queued kernel,
    so they come to the host only every ``interval`` iterations, when the
    text changes."""

    priority = extension.PRIORITY_READER

    def __init__(self, total, interval=10):
        self.total, self.interval = total, interval
        self.bar, self.smooth = None, {}
        try:
            from tqdm import tqdm
            self._tqdm = tqdm
        except ImportError:
            self._tqdm = None

    def __call__(self, trainer):
        for key in ('main/loss', 'main/accuracy'):
            if key in trainer.observation:
                v = trainer.observation[key]
                v = getattr(v, 'array', v)
                old = self.smooth.get(key)
                self.smooth[key] = v if old is None else 0.9 * old + 0.1 * v
        up = trainer.updater
        if self._tqdm is not None:
            if self.bar is None:
                self.bar = self._tqdm(total=self.total, initial=up.iteration -
                                      1, unit='it', file=sys.stdout,
                                      dynamic_ncols=True)
            self.bar.update(up.iteration - self.bar.n)
            if up.iteration % self.interval == 0:
                self.bar.set_postfix_str(self._text(up), refresh=False)
        elif up.iteration % self.interval == 0:
            print('iteration {}/{} epoch {:.2f} {}'.format(
                up.iteration, self.total, up.epoch_detail, self._text(up)),
                flush=True)

    def _text(self, up):
        """The postfix; the only place the smoothed values reach the host."""
        host = {k: float(backend.to_cpu(v)) for k, v in self.smooth.items()}
        rate = up.images_per_update * len(up.recent) / max(sum(up.recent),
                                                           1e-9)
        return 'loss {:.3f} acc {:.3f} {:.1f} img/s'.format(
            host.get('main/loss', float('nan')),
            host.get('main/accuracy', float('nan')), rate)

    def write(self, text):
        """Print ``text`` above the bar (a stream for PrintReport)."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stdout, end='')
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    def flush(self):
        sys.stdout.flush()

    def finalize(self):
        if self.bar is not None:
            self.bar.close()
