"""Stochastic gradient descent with (heavy-ball) momentum."""
from minichain import backend, optimizer

__all__ = ['MomentumSGD']


class MomentumSGDRule(optimizer.UpdateRule):
    """One momentum step on one parameter; state ``v`` (the velocity)."""

    elementwise = True

    state_names = ('v',)

    def update_core(self, param):
        hp = self.hyperparam
        grad, v = param.grad, self.state['v']
        tmp = self.workspace.get(grad)  # scratch for lr * grad
        xp = backend.get_array_module(grad)
        v *= hp.momentum                        # v = momentum * v - lr * g
        v -= xp.multiply(grad, hp.lr, out=tmp)
        param.array += v                        # param = param + v


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
