"""Hyper-parameter schedules: ExponentialShift and LinearShift."""
from minichain.training import extension

__all__ = ['ExponentialShift', 'LinearShift']


class _Shift(extension.Extension):
    """Sets ``optimizer.<attr>`` to ``value(t)`` after each call, ``t``
    counting the calls; resumable (``t`` and the last value are saved)."""

    def __init__(self, attr, optimizer):
        self._attr = attr
        self._optimizer = optimizer
        self._t = 0
        self._last_value = None

    def _get_optimizer(self, trainer):
        return self._optimizer or trainer.updater.get_optimizer('main')

    def _set(self, optimizer, value):
        setattr(optimizer, self._attr, value)
        self._last_value = value

    def initialize(self, trainer):
        """Set the value for the current ``t`` (the restored one after a
        resume) before the first iteration."""
        optimizer = self._get_optimizer(trainer)
        self._start(optimizer)
        value = self._value() if self._last_value is None else \
            self._last_value
        self._set(optimizer, value)

    def _start(self, optimizer):
        """Read what the schedule needs from the optimizer."""

    def __call__(self, trainer):
        self._t += 1
        self._set(self._get_optimizer(trainer), self._value())

    def serialize(self, serializer):
        """Save or load ``t`` and the last value set."""
        self._t = int(serializer('_t', self._t))
        value = serializer('_last_value', self._last_value)
        self._last_value = None if value is None else float(value)


class ExponentialShift(_Shift):
    """Multiplies a hyper-parameter by ``rate`` at each call:
    ``value(t) = init * rate ** t``, clipped at ``target``.

    Example: halve the learning rate every 10 epochs::

        trainer.extend(ExponentialShift('lr', 0.5), trigger=(10, 'epoch'))

    Args:
        attr: the optimizer attribute (``'lr'``; ``'alpha'`` for Adam).
        rate: the factor (> 0).
        init: the starting value; None reads the optimizer's at
            ``initialize``.
        target: a limit the value stops at (a floor when ``rate < 1``, a
            ceiling when ``rate > 1``).
        optimizer: the optimizer; None means the updater's 'main' one.
    """

    def __init__(self, attr, rate, init=None, target=None, optimizer=None):
        if rate <= 0:
            raise ValueError('ExponentialShift: rate must be positive, got {}'
                             .format(rate))
        super().__init__(attr, optimizer)
        self._rate = rate
        self._init = init
        self._target = target

    def _start(self, optimizer):
        if self._init is None:
            self._init = getattr(optimizer, self._attr)

    def _value(self):
        value = self._init * self._rate ** self._t
        if self._target is not None:
            if self._rate > 1:
                value = min(value, self._target)
            else:
                value = max(value, self._target)
        return value


class LinearShift(_Shift):
    """Moves a hyper-parameter linearly from ``v1`` to ``v2`` between calls
    ``t1`` and ``t2`` (constant before and after); a warm-up when
    ``v1 < v2``.

    .. math:: v(t) = v_1 + (v_2 - v_1)\\,\\frac{\\min(\\max(t, t_1), t_2)
              - t_1}{t_2 - t_1}

    Example: warm the learning rate up over 500 iterations::

        trainer.extend(LinearShift('lr', (0.0, 0.1), (0, 500)))

    Args:
        attr: the optimizer attribute.
        value_range: ``(v1, v2)``.
        time_range: ``(t1, t2)`` with ``t1 < t2``, in calls of the
            extension (iterations with the default trigger).
        optimizer: the optimizer; None means the updater's 'main' one.
    """

    def __init__(self, attr, value_range, time_range, optimizer=None):
        t1, t2 = time_range
        if not t1 < t2:
            raise ValueError('LinearShift: time_range must be (t1, t2) with '
                             't1 < t2, got {}'.format(time_range))
        super().__init__(attr, optimizer)
        self._value_range = tuple(value_range)
        self._time_range = (t1, t2)

    def _value(self):
        (v1, v2), (t1, t2) = self._value_range, self._time_range
        t = min(max(self._t, t1), t2)
        return v1 + (v2 - v1) * (t - t1) / (t2 - t1)
