"""Stopping on a signal: ``catch_stop_signals`` notes a batch system's stop
request, and the ``StopOnSignal`` stop trigger ends training at the next
iteration, on every rank together, so that a snapshot can be written.

Typical use (a data-parallel script; ``comm=None`` in one process)::

    triggers.catch_stop_signals()                  # first thing
    stop = triggers.StopOnSignal((90, 'epoch'), comm)
    trainer = training.Trainer(updater, stop, out='result')
    ...
    trainer.run()
    if stop.signum:                                # stopped early
        snapshot(trainer)                          # then exit 128 + signum
"""
import os
import signal
import sys
import time

from minichain.training.triggers.interval_trigger import get_trigger

__all__ = ['REPEAT_WINDOW', 'STOP_SIGNALS', 'StopOnSignal',
           'catch_stop_signals']

# Signals that ask for a stop: SIGTERM (batch systems, kill), SIGINT
# (Ctrl-C) and SIGUSR1/SIGUSR2, which Open MPI's mpirun passes to the
# ranks without killing them a second later as it does on SIGTERM, and
# which Slurm's --signal and Grid Engine's -notify send ahead of a stop.
STOP_SIGNALS = tuple(getattr(signal, name) for name in (
    'SIGTERM', 'SIGINT', 'SIGUSR1', 'SIGUSR2') if hasattr(signal, name))

# A stop signal repeated within this many seconds is one request delivered
# twice (by the scheduler and by the launcher), not a second request.
REPEAT_WINDOW = 1.0

_caught = {'signum': 0, 'at': 0.0}  # the first stop signal, and when


def _stalled():
    """Whether minichain.dist's watchdog sees this process stuck in a
    collective (never when minichain.dist is not in use: nothing is
    imported from a signal handler)."""
    watchdog = sys.modules.get('minichain.dist.guards.watchdog')
    return watchdog is not None and watchdog.stalled()


def catch_stop_signals():
    """From now on a stop signal (``STOP_SIGNALS``) only takes note, and
    :class:`StopOnSignal` acts on it between iterations.

    After that first signal, the process ends at once on a SIGINT (Ctrl-C
    again), on any stop signal more than ``REPEAT_WINDOW`` seconds after
    the first (a second request), or on any stop signal once the process
    has made no progress through minichain.dist's collectives for longer
    than the stall timeout (``minichain.dist.guards.watchdog.stalled``: it would
    never reach the next iteration). A SIGTERM or SIGUSR repeated within
    the window is the same request delivered twice (Slurm signals every
    process of a job step, and the launcher forwards what it got) and is
    ignored. Call it first thing, before any work.
    """
    def note(signum, frame):
        now = time.monotonic()
        again = _caught['signum'] and (
            signum == signal.SIGINT or now - _caught['at'] > REPEAT_WINDOW)
        if again or _stalled():
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        if not _caught['signum']:
            _caught['signum'], _caught['at'] = signum, now
    for s in STOP_SIGNALS:
        signal.signal(s, note)


class StopOnSignal:
    """A stop trigger: ``base`` (e.g. ``(90, 'epoch')``), or a stop signal
    noted by :func:`catch_stop_signals` on any rank.

    With a communicator, every call agrees on the signal with one tiny
    allreduce, so all ranks stop after the same iteration. After training,
    ``signum`` is the signal that stopped it (0: ``base`` did).

    Args:
        base: the trigger (or ``(period, unit)``) that ends training.
        comm: a minichain.dist communicator, or None in one process.
    """

    def __init__(self, base, comm=None):
        self.base, self.comm = get_trigger(base), comm
        self.signum = 0

    def __call__(self, trainer):
        signum = _caught['signum']
        if self.comm is not None:
            signum = self.comm.allreduce_obj(signum, 'max')
        self.signum = signum
        return bool(signum) or self.base(trainer)

    def get_training_length(self):
        """The base trigger's ``(length, unit)`` (for ProgressBar)."""
        return self.base.get_training_length()
