"""Triggers that fire when a reported value reaches a new best."""
from minichain import backend
from minichain.reporter import DictSummary
from minichain.training.triggers.interval_trigger import get_trigger

__all__ = ['BestValueTrigger', 'MaxValueTrigger', 'MinValueTrigger']


class BestValueTrigger:
    """Fires when the mean of ``key`` over an interval beats every earlier
    interval's mean.

    Args:
        key: an observation key such as ``'validation/main/loss'``.
        compare: ``compare(best, new)`` -> True when ``new`` is better.
        trigger: the interval over which values are averaged.
    """

    def __init__(self, key, compare, trigger=(1, 'epoch')):
        self._key = key
        self._compare = compare
        self._interval = get_trigger(trigger)
        self._summary = DictSummary()
        self._best = None

    @property
    def best_value(self):
        """The best mean so far (None before the first interval)."""
        return self._best

    def __call__(self, trainer):
        if self._key in trainer.observation:
            self._summary.add({self._key: trainer.observation[self._key]})
        if not self._interval(trainer):
            return False
        stats = self._summary.compute_mean()
        self._summary = DictSummary()
        if self._key not in stats:
            return False
        value = float(backend.to_cpu(stats[self._key]))
        if self._best is None or self._compare(self._best, value):
            self._best = value
            return True
        return False

    def serialize(self, serializer):
        """Save or load the best value and the partial interval."""
        if hasattr(self._interval, 'serialize'):
            self._interval.serialize(serializer['interval_trigger'])
        self._summary.serialize(serializer['summary'])
        best = serializer('best_value', self._best)
        self._best = None if best is None else float(best)


class MaxValueTrigger(BestValueTrigger):
    """Fires when the interval mean of ``key`` is the largest so far."""

    def __init__(self, key, trigger=(1, 'epoch')):
        super().__init__(key, lambda best, new: new > best, trigger)


class MinValueTrigger(BestValueTrigger):
    """Fires when the interval mean of ``key`` is the smallest so far."""

    def __init__(self, key, trigger=(1, 'epoch')):
        super().__init__(key, lambda best, new: new < best, trigger)
