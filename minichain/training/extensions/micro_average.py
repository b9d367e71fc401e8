"""MicroAverage: a ratio of sums over an interval, such as an accuracy."""
from minichain import reporter
from minichain.training import extension
from minichain.training.extensions.log_report import to_float
from minichain.training.triggers import get_trigger

__all__ = ['MicroAverage']


class MicroAverage(extension.Extension):
    """Reports ``sum(n_i) / sum(d_i)`` over the iterations of an interval.

    The model reports a numerator and a denominator every iteration (say
    the examples it got right and the examples it saw); this extension adds
    them up and, when ``trigger`` fires, reports their ratio under
    ``result_key`` and starts again from zero. Unlike the mean of the
    per-batch ratios (the macro average), the result counts every example
    once when batches differ in size. An iteration that lacks either key is
    skipped. Called every iteration (priority EDITOR, so a LogReport of the
    same iteration sees the result).

    Args:
        numerator_key, denominator_key: observation keys reported by the
            model (``'main/correct'``, ``'main/total'``).
        result_key: the key of the ratio (``'main/accuracy'``).
        trigger: when to report and reset (``(1, 'epoch')``); distinct from
            the extension's own trigger, which is every iteration.
    """

    priority = extension.PRIORITY_EDITOR

    def __init__(self, numerator_key, denominator_key, result_key,
                 trigger=(1, 'epoch')):
        self._trigger = get_trigger(trigger)
        self._numerator_key = numerator_key
        self._denominator_key = denominator_key
        self._result_key = result_key
        self._numerator = self._denominator = 0.0

    def __call__(self, trainer):
        observation = trainer.observation
        if self._numerator_key not in observation or \
                self._denominator_key not in observation:
            return
        self._numerator += to_float(observation[self._numerator_key])
        self._denominator += to_float(observation[self._denominator_key])
        if self._trigger(trainer):
            result = self._numerator / self._denominator
            self._numerator = self._denominator = 0.0
            reporter.report({self._result_key: result})

    def serialize(self, serializer):
        """The sums of the interval so far (a resumed run goes on)."""
        self._numerator = float(serializer('_numerator', self._numerator))
        self._denominator = float(serializer('_denominator',
                                             self._denominator))
