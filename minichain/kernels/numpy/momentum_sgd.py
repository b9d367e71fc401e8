"""MomentumSGD's update by row blocks on minichain's threads, each block
BLAS's axpby and axpy where NumPy's OpenBLAS can be called directly
(``_cpu_kernels.momentum_sgd``)."""
from minichain import kernels
from minichain.kernels.numpy import _cpu_kernels
from minichain.optimizers.momentum_sgd import MomentumSGDRule


def momentum_sgd(rule, param):
    grad, v = param.grad, rule.state['v']
    if not _cpu_kernels.fits(param.array, v, grad):
        return None
    hp = rule.hyperparam
    tmp = rule.workspace.get(grad)  # scratch for lr * grad
    _cpu_kernels.momentum_sgd(param.array, v, grad, tmp, hp.lr, hp.momentum)
    return True


kernels.register(MomentumSGDRule, 'numpy', momentum_sgd)
