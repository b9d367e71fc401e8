"""Plain stochastic gradient descent."""
from minichain import backend, optimizer

__all__ = ['SGD']


class SGDRule(optimizer.UpdateRule):
    """One SGD step on one parameter: ``param -= lr * grad``."""

    elementwise = True

    def update_core(self, param):
        grad = param.grad
        xp = backend.get_array_module(grad)
        step = xp.multiply(grad, self.hyperparam.lr,
                           out=self.workspace.get(grad))
        param.array -= step


class SGD(optimizer.GradientMethod):
    """Stochastic gradient descent.

    .. math:: \\theta \\leftarrow \\theta - \\eta\\, g

    Args:
        lr: learning rate :math:`\\eta` (settable between steps as
            ``opt.lr``).
    """

    lr = optimizer.HyperparameterProxy('lr', low=0)

    def __init__(self, lr=0.01):
        super().__init__()
        self.lr = lr

    def create_update_rule(self):
        return SGDRule(self.hyperparam, self._workspace)
