"""ReLU and its gradient as one pass split over minichain's threads."""
from minichain import kernels
from minichain.functions.activation import ReLU, ReLUGrad
from minichain.kernels.numpy import _cpu_kernels


def relu(node, inputs):
    x, = inputs
    if not _cpu_kernels.fits(x):
        return None
    node.retain_outputs((0,))
    return _cpu_kernels.relu(x),


def relu_grad(node, inputs):
    y, gy = inputs
    if not _cpu_kernels.fits(y, gy):
        return None
    node.retain_inputs((0,))
    return _cpu_kernels.relu_grad(y, gy),


kernels.register(ReLU, 'numpy', relu)
kernels.register(ReLUGrad, 'numpy', relu_grad)
