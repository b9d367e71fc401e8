"""Stochastic gradient descent with (heavy-ball) momentum."""
import numpy

from minichain import backend, optimizer
from minichain.functions import _parallel

__all__ = ['MomentumSGD']


class MomentumSGDRule(optimizer.UpdateRule):
    """One momentum step on one parameter; state ``v`` (the velocity)."""

    state_names = ('v',)

    def update_core(self, param):
        hp = self.hyperparam
        grad, v = param.grad, self.state['v']
        xp = backend.get_array_module(grad)
        tmp = self.workspace.get(grad)
        if xp is numpy:
            # big weights: the four passes run on row blocks in parallel
            mom, lr = hp.momentum, hp.lr

            def kernel(p, v, g, t):
                numpy.multiply(v, mom, out=v)
                v -= numpy.multiply(g, lr, out=t)
                p += v
            _parallel.elementwise(kernel, param.array, v, grad, tmp)
            return
        v *= hp.momentum
        v -= xp.multiply(grad, hp.lr, out=tmp)
        param.array += v


class MomentumSGD(optimizer.GradientMethod):
    """Momentum SGD, as in Chainer.

    .. math::
        v \\leftarrow \\mu v - \\eta\\, g, \\qquad
        \\theta \\leftarrow \\theta + v

    ``v`` starts at zero, one per parameter (``param.update_rule.state``).

    Args:
        lr: learning rate :math:`\\eta` (``opt.lr``, settable between steps).
        momentum: :math:`\\mu`, in ``[0, 1]``.
    """

    lr = optimizer.HyperparameterProxy('lr')
    momentum = optimizer.HyperparameterProxy('momentum')

    def __init__(self, lr=0.01, momentum=0.9):
        super().__init__()
        check = optimizer.check_hyperparameter
        self.hyperparam.lr = check('MomentumSGD', 'lr', lr, low=0)
        self.hyperparam.momentum = check('MomentumSGD', 'momentum', momentum,
                                         low=0, high=1)

    def create_update_rule(self):
        return MomentumSGDRule(self.hyperparam, self._workspace)
