"""IntervalTrigger (every N iterations or epochs) and get_trigger."""
import math
import numbers

__all__ = ['IntervalTrigger', 'get_trigger']

UNITS = ('epoch', 'iteration')


def check_unit(where, unit):
    """Raise ValueError unless ``unit`` is 'epoch' or 'iteration'."""
    if unit not in UNITS:
        raise ValueError("{}: unit must be 'epoch' or 'iteration', got {!r}"
                         .format(where, unit))


class IntervalTrigger:
    """Fires every ``period`` iterations or epochs.

    With ``unit='iteration'`` it fires after iterations ``period``,
    ``2 * period``, ...; with ``unit='epoch'`` it fires after the update in
    which ``updater.epoch_detail`` reaches or passes a multiple of
    ``period`` (a fraction such as 0.5 works). It keeps no state: it reads
    the updater's counters, so a resumed trainer fires at the same points.

    Args:
        period: a positive number (an int for iterations).
        unit: ``'epoch'`` or ``'iteration'``.
    """

    def __init__(self, period, unit):
        check_unit('IntervalTrigger', unit)
        if (not isinstance(period, numbers.Real) or isinstance(period, bool)
                or period <= 0):
            raise ValueError('IntervalTrigger: period must be a positive '
                             'number, got {!r}'.format(period))
        if unit == 'iteration' and int(period) != period:
            raise ValueError('IntervalTrigger: an iteration period must be an '
                             'integer, got {!r}'.format(period))
        self.period = period
        self.unit = unit

    def __call__(self, trainer):
        updater = trainer.updater
        if self.unit == 'iteration':
            iteration = updater.iteration
            return iteration > 0 and iteration % self.period == 0
        previous = updater.previous_epoch_detail
        if previous is None:
            return False
        return (math.floor(updater.epoch_detail / self.period)
                > math.floor(previous / self.period))

    def get_training_length(self):
        """``(period, unit)``: how long training runs when this trigger
        stops it (used by ProgressBar)."""
        return self.period, self.unit

    def __repr__(self):
        return 'IntervalTrigger({}, {!r})'.format(self.period, self.unit)


def _never(trainer):
    return False


def get_trigger(trigger):
    """Turn a trigger spec into a trigger.

    Args:
        trigger: a callable (returned as is), a ``(period, unit)`` tuple
            (an IntervalTrigger) or None (a trigger that never fires).
    """
    if trigger is None:
        return _never
    if callable(trigger):
        return trigger
    if isinstance(trigger, (tuple, list)) and len(trigger) == 2:
        return IntervalTrigger(*trigger)
    raise TypeError("get_trigger: expected a callable or a (period, unit) "
                    "tuple such as (1, 'epoch'), got {!r}".format(trigger))
