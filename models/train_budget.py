"""The time budget of models/train_resnet50.py: as many iterations as fit
``--time-budget`` minutes on this machine, planned early and re-planned
once.

The first iterations are ordinary training steps. Every rank times
iterations ``SKIP + 1`` to the warm-up's end, ``MEASURE`` at most (the
first ``SKIP`` carry one-time costs: memory allocated and touched for the
first time, kernels' primitives built), the ranks agree on the slowest
rank's speed, and :func:`plan` turns the time left into a number of
iterations, after setting aside what else the budget must hold: the
script's start-up before training (the process's age, so that the
interpreter and the imports count too), the evaluation at the end (its
cost estimated from the measured speed of the forward pass), and those
and the snapshots at every epoch's end on the way.

That first window is short, and the iterations soon after one-time costs
run slower than later ones (``make train`` planned from 63 img/s and went
on at 72, using 88% of its budget). So the run goes on timing, and once a
``REPLAN_SHARE`` of the way to the first length is done it plans again
from the speed of the iterations since, the last time, keeping a
``RESERVE`` of the budget for the speed to vary on: training and
evaluation then use 90-100% of it (the tests run synthetic speed-ups and
slowdowns through it).

The learning rate decays over the length in force: the first plan's until
the re-plan, then the second's (``WarmupDecayShift``'s ``total`` set
again: a step of 1-3% in the rate where it moves). Both lengths, the
iteration of the re-plan and the measurements are kept in the snapshots
(:class:`TimeBudget`'s state), so that a run resumed after the re-plan
goes on with the same rates, bit for bit, and does not measure again; one
resumed before it measures on. The first window lies inside the warm-up,
whose rates do not depend on the length (``WarmupDecayShift``'s ramp is a
function of the iteration and of the warm-up's length, fixed up front by
``--warmup``), so the iterations before the first plan get the rates that
any length would give them.
"""
import math
import os
import time
import warnings

from minichain.training import extension

SKIP = 2       # iterations with one-time costs, not measured
MEASURE = 60   # iterations measured at most (fewer when the warm-up ends)
# Bytes per second assumed for writing a snapshot (rank 0; a cautious
# figure for a disk: through the page cache it is several times faster).
SAVE_RATE = 100e6
# When the updater does not time its forward passes: the forward's share
# of an iteration (the backward costs about twice the forward).
FORWARD_SHARE = 1 / 3
# The re-plan: after this share of the way from the first plan to its
# length, from the speed of the iterations in between; it leaves this
# share of the budget unplanned (the speed still varies after it).
REPLAN_SHARE = 0.2
RESERVE = 0.05
# TimeBudget's stages: measuring the first window, measuring the second
# (the first plan in force), fixed for good.
MEASURING, REPLANNING, FIXED = 0, 1, 2


def process_age():
    """Seconds since this process started (the interpreter's start-up and
    the imports included), from Linux's /proc; None elsewhere."""
    try:
        with open('/proc/self/stat') as f:
            # the fields after the command name, which may hold spaces
            fields = f.read().rsplit(')', 1)[1].split()
        started = int(fields[19]) / os.sysconf('SC_CLK_TCK')
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Length:
    """The training length in iterations (``total``; None until a
    :class:`TimeBudget` fixes it), as a stop trigger: it fires once the
    updater has done ``total`` iterations. ``get_training_length()`` is
    None while ``total`` is, so that a ProgressBar waits for it."""

    def __init__(self, total=None):
        self.total = total

    def __call__(self, trainer):
        return self.total is not None and \
            trainer.updater.iteration >= self.total

    def get_training_length(self):
        """``(total, 'iteration')``, or None before the length is fixed."""
        return None if self.total is None else (self.total, 'iteration')


def window(warmup):
    """``(first, last)``: the iterations measured are ``first + 1`` to
    ``last``, inside a warm-up of ``warmup`` iterations; None when the
    warm-up is too short to measure two iterations."""
    last = min(SKIP + MEASURE, warmup)
    return (SKIP, last) if last - SKIP >= 2 else None


def plan(left, done, iteration, evaluation, snapshot, per_epoch,
         every=None):
    """The training length, in iterations, that fits ``left`` seconds.

    Training stops after iteration ``n``, the largest with ``cost(n) <=
    left``: ``n - done`` more iterations of ``iteration`` seconds, an
    evaluation (``evaluation`` seconds) and a snapshot (``snapshot``
    seconds) at the end and at each epoch's end on the way (every
    ``per_epoch`` iterations, a float), and the snapshots of
    ``--snapshot-every`` (``(N, 'iteration')`` or ``(seconds,
    'second')``). At least ``done``: training never goes back.
    """
    def cost(n):
        ends = (math.floor((n - 1) / per_epoch) - math.floor(done / per_epoch)
                if n > done else 0)  # epoch ends before the last iteration
        saves = 1 + ends
        if every and every[1] == 'iteration':
            saves += max(0, (n - 1) // every[0] - done // every[0])
        elif every:
            saves += math.floor((n - done) * iteration / every[0])
        return ((n - done) * iteration + (1 + ends) * evaluation
                + saves * snapshot)

    low, high = done, done + max(0, math.floor(left / iteration)) + 1
    while high - low > 1:  # cost(low) fits (or low == done), high does not
        middle = (low + high) // 2
        if cost(middle) <= left:
            low = middle
        else:
            high = middle
    return low


def minutes(seconds):
    """``'13 min'``, ``'12 min 48 s'``, ``'45 s'``."""
    m, s = divmod(round(seconds), 60)
    if not m:
        return '{} s'.format(s)
    return '{} min'.format(m) + (' {} s'.format(s) if s else '')


class TimeBudget(extension.Extension):
    """Fixes the training length from the speed of the iterations: see the
    module docstring.

    It runs first in each iteration (before the evaluation, which runs at
    the last one, and before the learning rate of the next update is set).
    At iteration ``measure[1]`` it plans: it sets ``length.total`` and
    ``schedule.total``. When the plan leaves room, it then times the
    iterations up to ``replan_at`` (a ``REPLAN_SHARE`` of the way to that
    length) and plans once more from their speed, the last time; rank 0
    prints each plan and why.

    Args:
        seconds: the budget: the script's start-up (each rank's process
            age when training starts), the training iterations, the
            evaluations and the snapshots.
        length: the run's :class:`Length` (its stop trigger's base).
        schedule: the WarmupDecayShift (None: no schedule to set).
        measure: ``(first, last)`` from :func:`window`.
        batchsize: images per rank and iteration.
        val_images: the images of an evaluation, all ranks together.
        per_epoch: iterations per epoch.
        snapshot_bytes: the size of a snapshot.
        every: ``--snapshot-every`` (from ``parse_interval``), or None.
        comm: the communicator (None: one process).
        clock: the time in seconds (``time.perf_counter``; tests pass
            their own).
        age: the seconds this process has run (:func:`process_age`; None
            from it: not known, counted as 0).
        out: where rank 0 writes its line (default: print).
    """

    priority = extension.PRIORITY_WRITER + 100
    name = 'time_budget'

    def __init__(self, seconds, length, schedule, measure, batchsize,
                 val_images, per_epoch, snapshot_bytes=0, every=None,
                 comm=None, clock=time.perf_counter, out=None,
                 age=process_age):
        self.seconds, self.length, self.schedule = seconds, length, schedule
        self.first, self.last = measure
        self.batchsize, self.per_epoch, self.every = batchsize, per_epoch, \
            every
        self.size = comm.size if comm is not None else 1
        self.val_images = val_images
        self.save_seconds = snapshot_bytes / SAVE_RATE
        self.comm, self.clock, self.age = comm, clock, age
        self.out = out or (lambda line: print(line, flush=True))
        self.stage = MEASURING
        # the window being measured (after the re-plan: the last one), on
        # this rank, then the slowest rank's (kept in snapshots)
        self.measured, self.iteration_seconds, self.forward_seconds = \
            0, 0.0, 0.0
        # this rank's start-up: the seconds before training (every run's
        # while the length is not fixed)
        self.startup = 0.0
        # the first plan: its length and speed, and where the re-plan comes
        self.first_total, self.first_speed, self.replan_at = None, 0.0, None
        self._previous = self._start = None

    # -- the state a resumed run continues from ------------------------------
    @property
    def fixed(self):
        """Whether the length is fixed for good (no plan to come)."""
        return self.stage == FIXED

    def serialize(self, serializer):
        """Save or load the stage, the length (-1: not planned yet), the
        measurement (seconds summed over the iterations measured so far),
        the start-up seconds and the first plan.

        A snapshot of the version before the re-plan (no ``stage``) loads
        as that version ran it: a length once planned is fixed."""
        try:
            stage = int(serializer('stage', self.stage))
        except KeyError:  # the earlier snapshot: no stage, no first plan
            stage = None
        total = serializer('total', -1 if self.length.total is None else
                           self.length.total)
        self.length.total = None if int(total) < 0 else int(total)
        if stage is None:
            self.stage = MEASURING if self.length.total is None else FIXED
            self._serialize_measurement(serializer)
            return
        self.stage = stage
        self._serialize_measurement(serializer)
        first = serializer('first_total', -1 if self.first_total is None
                           else self.first_total)
        self.first_total = None if int(first) < 0 else int(first)
        self.first_speed = float(serializer('first_speed', self.first_speed))
        at = serializer('replan_at', -1 if self.replan_at is None else
                        self.replan_at)
        self.replan_at = None if int(at) < 0 else int(at)

    def _serialize_measurement(self, serializer):
        self.measured = int(serializer('measured', self.measured))
        self.iteration_seconds = float(serializer('iteration_seconds',
                                                  self.iteration_seconds))
        self.forward_seconds = float(serializer('forward_seconds',
                                                self.forward_seconds))
        self.startup = float(serializer('startup', self.startup))

    def initialize(self, trainer):
        """Give the schedule a length restored from a snapshot; while a
        plan is to come, start timing (the first iteration of this process
        is not measured: it carries one-time costs again)."""
        if self.length.total is not None and self.schedule is not None:
            self.schedule.total = self.length.total
        if self.fixed:
            return
        self.startup += self.age() or 0.0
        self._previous = None
        self._start = (self.clock(), _forward_clock(trainer),
                       trainer.updater.iteration)
        _sync_forward(trainer, True)

    # -- measuring ----------------------------------------------------------
    def __call__(self, trainer):
        if self.fixed:
            return
        now, forward = self.clock(), _forward_clock(trainer)
        iteration = trainer.updater.iteration
        if self._previous is not None and iteration > self.first:
            self._add(1, now - self._previous[0],
                      _since(forward, self._previous[1], now -
                             self._previous[0]))
        self._previous = (now, forward)
        if iteration >= (self.last if self.stage == MEASURING
                         else self.replan_at):
            self._plan(trainer, now, forward)

    def _add(self, iterations, seconds, forward):
        self.measured += iterations
        self.iteration_seconds += seconds
        self.forward_seconds += forward

    def _plan(self, trainer, now, forward):
        iteration = trainer.updater.iteration
        if not self.measured:  # resumed just before the end of the window
            then, forward_then, start = self._start
            self._add(iteration - start, now - then,
                      _since(forward, forward_then, now - then))
        mine = (self.iteration_seconds / self.measured,
                self.forward_seconds / self.measured,
                trainer.elapsed_time + self.startup, self.startup)
        every = [mine] if self.comm is None else \
            self.comm.allgather_obj(mine)
        step, forward_step, elapsed, self.startup = (max(v)
                                                     for v in zip(*every))
        self.iteration_seconds = step * self.measured  # the slowest rank's
        self.forward_seconds = forward_step * self.measured
        # The re-plan is the last: it leaves a RESERVE for the speed to
        # vary on (the first plan need not: the re-plan corrects it).
        left = self.seconds * (1 - (RESERVE if self.stage else 0)) - elapsed
        total = plan(left, iteration, step, self.evaluation_seconds(),
                     self.save_seconds, self.per_epoch, self.every)
        if self.comm is not None:  # the same on every rank, whatever differs
            total = min(self.comm.allgather_obj(total))
        self.length.total = total
        if self.schedule is not None:
            self.schedule.total = total
        line = self.banner(elapsed - self.startup + (total - iteration) * step)
        if self.stage == MEASURING:
            self._first_plan(total, iteration)
        else:
            self.stage = FIXED
        if self.fixed:
            _sync_forward(trainer, False)
        if self.comm is None or self.comm.rank == 0:
            self.out(line)
            warmup = getattr(self.schedule, 'warmup', 0)
            if self.replan_at in (None, iteration) and total < 2 * warmup:
                warnings.warn(
                    'the time budget allows {} iterations, and the warm-up '
                    'alone takes {}: the learning rate hardly decays; give '
                    'a longer --time-budget or a shorter --warmup'.format(
                        total, warmup))

    def _first_plan(self, total, iteration):
        """Keep the first plan; re-plan at a REPLAN_SHARE of the way to it
        when that leaves two iterations to measure and one to correct."""
        self.first_total, self.first_speed = total, self.images_per_second()
        replan = iteration + max(2, math.ceil(REPLAN_SHARE *
                                              (total - iteration)))
        if replan >= total:
            self.stage = FIXED
            return
        self.stage, self.replan_at = REPLANNING, replan
        self.measured, self.iteration_seconds, self.forward_seconds = \
            0, 0.0, 0.0

    # -- what it says -------------------------------------------------------
    def images_per_second(self):
        """The measured speed, all ranks (the slowest rank's pace); the
        first plan's while the second window has none."""
        if not self.measured:
            return self.first_speed
        return self.measured * self.batchsize * self.size / \
            self.iteration_seconds

    def evaluation_seconds(self):
        """The estimated cost of one evaluation: a rank's share of the
        validation images at the measured speed of the training forward
        pass (an overestimate: the evaluation's batch is larger and its
        batch norm does less); 0 before anything is measured."""
        if not self.measured:
            return 0.0
        per_image = self.forward_seconds / (self.measured * self.batchsize)
        return math.ceil(self.val_images / self.size) * per_image

    def banner(self, training):
        """What was measured and chosen, and why (one line); ``training``:
        the seconds the iterations will have taken."""
        total = self.length.total
        how = ('measured' if self.stage == MEASURING else
               're-planned at iteration {} from'.format(self.replan_at))
        return ('time budget {}: {} {:.1f} img/s over {} iterations '
                '-> {:,} images ({:,} iterations) in {}, then about {} to '
                'evaluate {:,} images (after {} of start-up)'.format(
                    minutes(self.seconds), how, self.images_per_second(),
                    self.measured, total * self.batchsize * self.size, total,
                    minutes(training), minutes(self.evaluation_seconds()),
                    self.val_images, minutes(self.startup)))

    def summary(self, elapsed):
        """The final summary's line: the budget, what it chose, and the
        time training and evaluation took (``elapsed`` seconds)."""
        replanned = ''
        if self.replan_at is not None:
            replanned = (', re-planned at iteration {} (first {:,} from '
                         '{:.1f} img/s)'.format(self.replan_at,
                                                self.first_total,
                                                self.first_speed))
        return ('time budget {}: {:,} iterations from {:.1f} img/s measured '
                'over {} iterations{}; start-up took {}, training and '
                'evaluation {}'.format(
                    minutes(self.seconds), self.length.total,
                    self.images_per_second(), self.measured, replanned,
                    minutes(self.startup), minutes(elapsed)))


def _forward_clock(trainer):
    """Seconds the updater spent in forward passes so far, or None when it
    does not count them."""
    return getattr(trainer.updater, 'forward_seconds', None)


def _sync_forward(trainer, on):
    """Have the updater time its forward passes exactly (on a GPU: wait
    for the device), or stop waiting."""
    if hasattr(trainer.updater, 'sync_forward'):
        trainer.updater.sync_forward = on


def _since(forward, before, seconds):
    """Forward seconds between two readings of :func:`_forward_clock`; a
    share of the ``seconds`` the iterations took when it reads None."""
    if forward is None or before is None:
        return FORWARD_SHARE * seconds
    return forward - before
