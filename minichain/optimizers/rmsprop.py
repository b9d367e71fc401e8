"""RMSprop: gradient steps scaled by a running RMS of the gradient."""
from minichain import backend, optimizer

__all__ = ['RMSprop']


class RMSpropRule(optimizer.UpdateRule):
    """One RMSprop step on one parameter; state ``ms`` (mean square)."""

    elementwise = True

    state_names = ('ms',)

    def update_core(self, param):
        hp = self.hyperparam
        grad, ms = param.grad, self.state['ms']
        xp = backend.get_array_module(grad)
        tmp = xp.multiply(grad, grad, out=self.workspace.get(grad))
        tmp *= 1 - hp.alpha
        ms *= hp.alpha
        ms += tmp
        denom = xp.sqrt(ms, out=tmp)
        denom += hp.eps
        step = xp.multiply(grad, hp.lr, out=self.workspace.get(grad, 1))
        step /= denom
        param.array -= step


class RMSprop(optimizer.GradientMethod):
    """RMSprop (Tieleman and Hinton), as in Chainer.

    .. math::
        m \\leftarrow \\alpha m + (1 - \\alpha) g^2, \\qquad
        \\theta \\leftarrow \\theta - \\frac{\\eta\\, g}{\\sqrt{m} + \\epsilon}

    Args:
        lr: learning rate :math:`\\eta` (``opt.lr``, settable between steps).
        alpha: decay rate :math:`\\alpha` of the mean square, in ``[0, 1]``.
        eps: :math:`\\epsilon`, added to the root mean square.
    """

    lr = optimizer.HyperparameterProxy('lr', low=0)
    alpha = optimizer.HyperparameterProxy('alpha', low=0, high=1)
    eps = optimizer.HyperparameterProxy('eps', low=0)

    def __init__(self, lr=0.01, alpha=0.99, eps=1e-8):
        super().__init__()
        self.lr, self.alpha, self.eps = lr, alpha, eps

    def create_update_rule(self):
        return RMSpropRule(self.hyperparam, self._workspace)
