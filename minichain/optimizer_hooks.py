"""Optimizer hooks: callables run by ``opt.update()`` around the step.

Register with ``opt.add_hook(hook)``; both hooks here run before the step
(``timing = 'pre'``) and edit gradients. They rebind ``param.grad`` to a new
array instead of writing into it, because a gradient array may be shared
between parameters or be a read-only broadcast view (see
``minichain.optimizer``). The last lines put both under Chainer v3's
paths too (``chainer.optimizer.WeightDecay``), deprecated.
"""
import warnings

import numpy

from minichain import backend, optimizer
from minichain.optimizer import check_hyperparameter

__all__ = ['WeightDecay', 'GradientClipping']


def _params_with_grad(optimizer):
    return [p for p in optimizer.target.params(include_uninit=False)
            if p.grad is not None]


class WeightDecay:
    """L2 regularization: adds ``rate * param`` to each gradient.

    .. math:: g \\leftarrow g + \\lambda \\theta

    (the gradient of :math:`\\frac{\\lambda}{2}\\|\\theta\\|^2` added to the
    loss). Parameters without a gradient are skipped.

    Args:
        rate: :math:`\\lambda \\ge 0`.
    """

    name = 'WeightDecay'
    timing = 'pre'

    def __init__(self, rate):
        self.rate = check_hyperparameter('WeightDecay', 'rate', rate, low=0)

    def __call__(self, optimizer):
        for param in _params_with_grad(optimizer):
            xp = backend.get_array_module(param.array)
            grad = xp.multiply(param.array, self.rate)
            grad += param.grad
            param.grad = grad


class GradientClipping:
    """Rescale all gradients together so their global L2 norm is at most
    ``threshold``.

    .. math::
        n = \\sqrt{\\textstyle\\sum_i \\|g_i\\|^2}, \\qquad
        g_i \\leftarrow g_i \\cdot \\min\\!\\Big(1,
        \\frac{\\tau}{n + 10^{-6}}\\Big)

    The norm is taken over every parameter that has a gradient (the small
    constant avoids a division by zero). On the GPU the factor stays a device
    scalar, so no value is copied to the host; all parameters must then live
    on one device.

    Args:
        threshold: :math:`\\tau > 0`.
    """

    name = 'GradientClipping'
    timing = 'pre'

    def __init__(self, threshold):
        self.threshold = check_hyperparameter('GradientClipping', 'threshold',
                                              threshold, low=0)
        if threshold == 0:
            raise ValueError('GradientClipping: threshold must be > 0, got 0')

    def __call__(self, optimizer):
        params = _params_with_grad(optimizer)
        xp = backend.get_array_module(params[0].grad) if params else numpy
        sqnorm = 0
        for param in params:
            g = param.grad.ravel()
            if g.dtype == numpy.float16:  # a half-precision sum overflows
                g = g.astype(numpy.float32)
            sqnorm = sqnorm + xp.dot(g, g)
        # A sharded multi-node optimizer steps one shard per rank (its
        # target is then the shard's): the norm is summed over the ranks.
        over_shards = getattr(optimizer.target, 'sum_over_shards', None)
        if over_shards is not None:
            sqnorm = xp.asarray(over_shards(sqnorm))
        if not params:
            return
        rate = xp.minimum(1.0, self.threshold / (xp.sqrt(sqnorm) + 1e-6))
        if xp is numpy and rate >= 1:
            return  # on the host the test is free: skip the copies
        for param in params:
            param.grad = param.grad * rate.astype(param.grad.dtype)


def _old_path(hook):
    """``hook`` under its path before Chainer v4, ``chainer.optimizer.<name>``,
    still met in older scripts: it warns, as Chainer v4+ does."""
    def __init__(self, *args, **kwargs):
        warnings.warn('minichain.optimizer.{0} (chainer.optimizer.{0}) is '
                      'deprecated, as in Chainer v4: use minichain.'
                      'optimizer_hooks.{0}'.format(hook.__name__),
                      DeprecationWarning, stacklevel=2)
        hook.__init__(self, *args, **kwargs)
    return type(hook.__name__, (hook,), {'__init__': __init__,
                                         '__module__': optimizer.__name__})


# Installed from here: minichain.optimizer does not import its hooks.
optimizer.WeightDecay = _old_path(WeightDecay)
optimizer.GradientClipping = _old_path(GradientClipping)
