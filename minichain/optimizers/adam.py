"""Adam: steps from bias-corrected running moments of the gradient."""
import math

from minichain import backend, optimizer

__all__ = ['Adam']


def _effective_lr(hp, t):
    """``alpha * sqrt(1 - beta2^t) / (1 - beta1^t)``: Adam's step size at
    update ``t`` (``t >= 1``), which folds in both bias corrections."""
    return hp.alpha * math.sqrt(1 - hp.beta2 ** t) / (1 - hp.beta1 ** t)


class AdamRule(optimizer.UpdateRule):
    """One Adam step on one parameter; state ``m`` and ``v`` (first and
    second moments)."""

    elementwise = True

    state_names = ('m', 'v')

    @property
    def lr(self):
        """The step size of this parameter's latest update (its next one
        before any)."""
        return _effective_lr(self.hyperparam, max(self.t, 1))

    def update_core(self, param):
        hp = self.hyperparam
        grad, m, v = param.grad, self.state['m'], self.state['v']
        xp = backend.get_array_module(grad)
        tmp = xp.subtract(grad, m, out=self.workspace.get(grad))
        tmp *= 1 - hp.beta1
        m += tmp
        tmp = xp.multiply(grad, grad, out=tmp)
        tmp -= v
        tmp *= 1 - hp.beta2
        v += tmp
        denom = xp.sqrt(v, out=tmp)
        denom += hp.eps
        step = xp.multiply(m, self.lr, out=self.workspace.get(grad, 1))
        step /= denom
        if hp.weight_decay_rate != 0:
            step += xp.multiply(param.array, hp.weight_decay_rate, out=denom)
        param.array -= step


class Adam(optimizer.GradientMethod):
    """Adam (Kingma and Ba), with bias correction, as in Chainer.

    .. math::
        m &\\leftarrow m + (1 - \\beta_1)(g - m), \\qquad
        v \\leftarrow v + (1 - \\beta_2)(g^2 - v) \\\\
        \\eta_t &= \\alpha \\frac{\\sqrt{1 - \\beta_2^t}}{1 - \\beta_1^t},
        \\qquad
        \\theta \\leftarrow \\theta - \\Big(\\eta_t \\frac{m}{\\sqrt{v} +
        \\epsilon} + \\lambda \\theta\\Big)

    where :math:`t` counts the parameter's updates and :math:`\\lambda` is
    ``weight_decay_rate`` (decoupled weight decay, AdamW; 0 disables it).

    Args:
        alpha: base step size :math:`\\alpha` (``opt.alpha``, settable).
        beta1, beta2: moment decay rates, in ``[0, 1)``.
        eps: :math:`\\epsilon`.
        weight_decay_rate: :math:`\\lambda`.

    ``opt.lr`` is read-only: :math:`\\eta_t` for the optimizer's ``t`` (the
    step just taken; the first step's before any), like Chainer's.
    """

    alpha = optimizer.HyperparameterProxy('alpha', low=0)
    beta1 = optimizer.HyperparameterProxy('beta1', low=0, high=1,
                                          open_high=True)
    beta2 = optimizer.HyperparameterProxy('beta2', low=0, high=1,
                                          open_high=True)
    eps = optimizer.HyperparameterProxy('eps', low=0)
    weight_decay_rate = optimizer.HyperparameterProxy('weight_decay_rate',
                                                      low=0)

    def __init__(self, alpha=0.001, beta1=0.9, beta2=0.999, eps=1e-8,
                 weight_decay_rate=0):
        super().__init__()
        self.alpha, self.beta1, self.beta2 = alpha, beta1, beta2
        self.eps, self.weight_decay_rate = eps, weight_decay_rate

    @property
    def lr(self):
        """The effective step size :math:`\\eta_t` (read-only; set
        ``alpha``)."""
        return _effective_lr(self.hyperparam, max(self.t, 1))

    @lr.setter
    def lr(self, value):
        raise AttributeError('Adam.lr is the effective step size and is '
                             'read-only; set Adam.alpha instead')

    def create_update_rule(self):
        return AdamRule(self.hyperparam, self._workspace)
