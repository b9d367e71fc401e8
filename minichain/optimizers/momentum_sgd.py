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
        step = self.workspace.get(grad)  # scratch for lr * (g + wd * param)
        xp = backend.get_array_module(grad)
        if hp.weight_decay_rate:         # g + wd * param, as WeightDecay
            xp.multiply(param.array, hp.weight_decay_rate, out=step)
            step += grad
            step *= hp.lr
        else:
            xp.multiply(grad, hp.lr, out=step)
        v *= hp.momentum                 # v = momentum * v - lr * g
        v -= step
        param.array += v                 # param = param + v


class MomentumSGD(optimizer.GradientMethod):
    """Momentum SGD, as in Chainer, with optional L2 weight decay.

    .. math::
        v \\leftarrow \\mu v - \\eta\\, (g + \\lambda \\theta), \\qquad
        \\theta \\leftarrow \\theta + v

    ``v`` starts at zero, one per parameter (``param.update_rule.state``).
    :math:`\\lambda` (``weight_decay_rate``) adds the gradient of
    :math:`\\frac{\\lambda}{2}\\|\\theta\\|^2`, as the ``WeightDecay`` hook
    does (PyTorch's SGD ``weight_decay``), in the same arithmetic, so the
    two give the same numbers; in the rule, a kernel can do the decay and
    the step in one pass over the arrays instead of three
    (kernels/onednn/optimizers.py), within a few units in the last place
    of the hook's (it rounds ``lr * wd`` once and fuses the adds).

    Args:
        lr: learning rate :math:`\\eta` (``opt.lr``, settable between steps).
        momentum: :math:`\\mu`, in ``[0, 1]``.
        weight_decay_rate: :math:`\\lambda \\ge 0` (default 0: none).
    """

    lr = optimizer.HyperparameterProxy('lr', low=0)
    momentum = optimizer.HyperparameterProxy('momentum', low=0, high=1)
    weight_decay_rate = optimizer.HyperparameterProxy('weight_decay_rate',
                                                      low=0)

    def __init__(self, lr=0.01, momentum=0.9, weight_decay_rate=0):
        super().__init__()
        self.lr, self.momentum = lr, momentum
        self.weight_decay_rate = weight_decay_rate

    def create_update_rule(self):
        return MomentumSGDRule(self.hyperparam, self._workspace)
