"""Hyper-parameter schedules: ExponentialShift, LinearShift and
WarmupDecayShift."""
import math

from minichain.training import extension

__all__ = ['ExponentialShift', 'LinearShift', 'WarmupDecayShift']


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
        if self._target is not None:  # a ceiling when growing, else a floor
            value = (min if self._rate > 1 else max)(value, self._target)
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


DECAYS = ('cosine', 'linear', 'step')


class WarmupDecayShift(extension.Extension):
    """A linear warm-up to ``peak``, then a decay (Goyal et al., 2017):
    the learning-rate schedule of large-batch data-parallel training.

    The value for the update that follows ``i`` updates is

    * during the warm-up (``i < warmup``):
      ``start + (peak - start) * i / warmup``;
    * after it, with ``r = (i - warmup) / (total - warmup)`` clipped to 1:
      ``'cosine'``: ``peak * (1 + cos(pi * r)) / 2``, ``'linear'``:
      ``peak * (1 - r)``, both reaching 0 at ``total``; ``'step'``:
      ``peak * rate ** k``, ``k`` the number of ``steps`` fractions ``f``
      with ``i >= f * total``.

    It is a function of ``trainer.updater.iteration`` alone: a resumed
    trainer gets the same values bit for bit, and snapshots hold nothing
    of it. Keep the default trigger (every iteration); the value of the
    first update is set before it (``initialize``, also after a resume).
    It runs after the writers (``PRIORITY_READER``), so ``observe_lr``
    reports the value the iteration used.

    Example: ResNet-50 on ImageNet, 90 epochs of ``n`` iterations, five of
    warm-up, x0.1 at epochs 30, 60 and 80::

        trainer.extend(WarmupDecayShift('lr', 0.1 * batch / 256, 90 * n,
                                        warmup=5 * n, decay='step'))

    Args:
        attr: the optimizer attribute (``'lr'``).
        peak: the value at the end of the warm-up.
        total: the number of iterations of training (the decay's end).
        warmup: the iterations of the warm-up (0: none).
        decay: ``'cosine'``, ``'linear'`` or ``'step'``.
        start: the value before the first update (default ``peak / 10``).
        steps: ``'step'``: the fractions of ``total`` at which the value is
            multiplied by ``rate`` (default 1/3, 2/3 and 8/9: epochs 30, 60
            and 80 of 90).
        rate: ``'step'``: the factor.
        optimizer: the optimizer; None means the updater's 'main' one.

    ``total`` and ``warmup`` may be set again before an iteration (by a
    script that fixes the training length once it has measured its speed);
    the values follow the new ones from the next update on.
    """

    priority = extension.PRIORITY_READER

    def __init__(self, attr, peak, total, warmup=0, decay='cosine',
                 start=None, steps=(1 / 3, 2 / 3, 8 / 9), rate=0.1,
                 optimizer=None):
        if decay not in DECAYS:
            raise ValueError('WarmupDecayShift: decay must be one of {}, got '
                             '{!r}'.format(', '.join(DECAYS), decay))
        for name, value, least in (('total', total, 1),
                                   ('warmup', warmup, 0)):
            if int(value) != value or value < least:
                raise ValueError('WarmupDecayShift: {} must be a whole number '
                                 'of iterations, at least {}, got {!r}'
                                 .format(name, least, value))
        self.attr, self.peak = attr, peak
        self.total, self.warmup = int(total), int(warmup)
        self.decay = decay
        self.start = peak / 10 if start is None else start
        self.steps, self.rate = tuple(steps), rate
        self._optimizer = optimizer

    def value(self, i):
        """The value for the update that follows ``i`` updates."""
        if i < self.warmup:
            return self.start + (self.peak - self.start) * i / self.warmup
        if self.decay == 'step':
            return self.peak * self.rate ** sum(i >= self.total * f
                                                for f in self.steps)
        r = min(1.0, (i - self.warmup) / max(1, self.total - self.warmup))
        if self.decay == 'cosine':
            return self.peak * 0.5 * (1 + math.cos(math.pi * r))
        return self.peak * (1 - r)

    def _set(self, trainer):
        optimizer = self._optimizer or trainer.updater.get_optimizer('main')
        setattr(optimizer, self.attr, self.value(trainer.updater.iteration))

    def initialize(self, trainer):
        """Set the value of the next update (the first, or the first after
        a resume)."""
        self._set(trainer)

    def __call__(self, trainer):
        self._set(trainer)
