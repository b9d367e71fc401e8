"""ManualScheduleTrigger: fires at listed iterations or epochs."""
import numbers

from minichain.training.triggers.interval_trigger import check_unit

__all__ = ['ManualScheduleTrigger']


class ManualScheduleTrigger:
    """Fires at the given points of training.

    Args:
        points: a number or a list of numbers (iterations, or epochs that
            may be fractional).
        unit: ``'epoch'`` or ``'iteration'``.

    With ``unit='epoch'`` it fires after the update whose
    ``epoch_detail`` reaches or passes a point. Stateless, like
    IntervalTrigger.

    Attributes:
        finished: True once the last point has passed.
    """

    def __init__(self, points, unit):
        check_unit('ManualScheduleTrigger', unit)
        if isinstance(points, numbers.Real):
            points = [points]
        self.points = sorted(points)
        if not self.points:
            raise ValueError('ManualScheduleTrigger: points is empty')
        self.unit = unit
        self.finished = False

    def __call__(self, trainer):
        updater = trainer.updater
        if self.unit == 'iteration':
            now, previous = updater.iteration, updater.iteration - 1
        else:
            now, previous = updater.epoch_detail, updater.previous_epoch_detail
            if previous is None:
                return False
        self.finished = now >= self.points[-1]
        return any(previous < p <= now for p in self.points)
