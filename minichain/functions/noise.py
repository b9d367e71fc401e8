"""Noise injection: dropout."""
import numpy

from minichain import backend
from minichain.configuration import config
from minichain.function_node import FunctionNode
from minichain.functions._check import check_float
from minichain.variable import as_variable

__all__ = ['dropout']


class Dropout(FunctionNode):
    def __init__(self, ratio, rng=None):
        self.ratio, self.rng = ratio, rng
        self.mask = None

    def forward(self, inputs):
        x, = inputs
        xp = backend.get_array_module(x)
        if self.rng is not None:
            rand = getattr(self.rng, 'random', None) or self.rng.random_sample
            r = rand(x.shape)
        elif xp is numpy:
            r = numpy.random.random_sample(x.shape)
        else:
            # CuPy draws float32 directly (half the bytes of float64).
            dtype = x.dtype if x.dtype == xp.float64 else xp.float32
            r = xp.random.random_sample(x.shape, dtype=dtype)
        scale = x.dtype.type(1.0 / (1.0 - self.ratio))
        # The mask is random, so backward cannot rebuild it from the inputs
        # or outputs: keep it (x.dtype, with the 1/(1-ratio) scale folded in).
        self.mask = (r >= self.ratio).astype(x.dtype) * scale
        return x * self.mask,

    def backward(self, indexes, grad_outputs):
        # Multiplying by a constant array keeps the gradient differentiable.
        return grad_outputs[0] * self.mask,


def dropout(x, ratio=0.5, rng=None):
    """Zero each element with probability ``ratio`` and scale the rest.

    In training (``minichain.config.train`` True):
    ``y = x * m / (1 - ratio)`` with ``m ~ Bernoulli(1 - ratio)`` per
    element, so ``E[y] = x``. Otherwise (or when ``ratio == 0``) ``x`` is
    returned as it is.

    Args:
        x: float Variable or ndarray of any shape.
        ratio: drop probability in ``[0, 1)``.
        rng: optional random generator with ``random(shape)`` or
            ``random_sample(shape)`` (``numpy.random.RandomState``,
            ``numpy.random.Generator``, CuPy's); by default the global
            ``xp.random`` state (seed it with ``numpy.random.seed``).
    Returns:
        Variable of ``x.shape``.
    """
    check_float('dropout', x, 'x')
    if not isinstance(ratio, (int, float)) or not 0.0 <= ratio < 1.0:
        raise ValueError('dropout: ratio must be a number in [0, 1), got {!r}'
                         .format(ratio))
    if not config.train or ratio == 0:
        return as_variable(x)
    return Dropout(float(ratio), rng).apply((x,))[0]
