"""Trainer pieces of models/train_resnet50.py.

``TimedUpdater`` (images per second, reproducible augmentation),
``LearningRate`` (warm-up then decay, stateless), ``StopOnSignal`` (the
stop trigger that lets all ranks stop together on SIGTERM/SIGINT),
and ``Progress`` (rank 0's bar).
"""
import math
import os
import signal
import sys
import time

from minichain import backend, training
from minichain.dist import watchdog
from minichain.training import extension


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


_caught = {'signum': 0}  # the last SIGTERM/SIGINT this process received


def catch_signals():
    """From now on the first SIGTERM or SIGINT only takes note
    (``StopOnSignal`` acts on it between iterations); a second one ends
    the process at once, and so does a first one when the process has made
    no progress through the collectives for longer than the stall timeout
    (``minichain.dist.watchdog.stalled``: it would not reach the next
    iteration). Call it first thing."""
    def note(signum, frame):
        if _caught['signum'] or watchdog.stalled():
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        _caught['signum'] = signum
    for s in (signal.SIGTERM, signal.SIGINT):
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
