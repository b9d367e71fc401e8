"""Batch normalization on NumPy in few passes over memory: BLAS sums, a
one-pass variance where it is accurate, channel blocks that stay in cache
(``_normalization_kernels.py``, ``_channels.py``).

The forward kernels compute ``x * scale + shift`` where the body computes
``(x - mean) * scale + beta``: the same numbers, but not the same NaN and
infinities when a per-channel parameter is not finite (an infinite gamma
gives inf - inf here and +-inf in the body, which relu then clips to 0).
They decline such parameters (a check of C values each)."""
import numpy

from minichain import kernels
from minichain.functions.normalization import (BatchNormalization,
                                               BatchNormalizationGrad,
                                               FixedBatchNormalization)
from minichain.kernels.numpy import _normalization_kernels as K
from minichain.kernels.numpy._layout import native


def finite(*arrays):
    """Whether the (per-channel, small) ``arrays`` are all finite."""
    return all(numpy.isfinite(a).all() for a in arrays)


def batch_normalization(node, inputs):
    if not (native(inputs) and finite(*inputs[1:3])):
        return None
    x, gamma, beta = inputs[:3]
    residual = inputs[3] if len(inputs) == 4 else None
    y, mean, var, inv_std, centered = K.cpu_forward(
        x, gamma, beta, node.eps, node.lay, residual, node.relu)
    node.keep_statistics(mean, var, inv_std, centered)
    return y,


def batch_normalization_grad(node, inputs):
    if not native(inputs):
        return None
    node.retain_inputs(tuple(range(len(inputs))))
    x, gamma, gy = node.masked(inputs)
    return K.cpu_backward(x, gamma, gy, node.mean, node.inv_std,
                          node.centered, node.lay)


def fixed_batch_normalization(node, inputs):
    if not (native(inputs) and finite(*inputs[1:])):
        return None
    node.retain_inputs((0, 1, 3, 4))
    x, gamma, beta, mean, var = inputs
    scale = gamma / numpy.sqrt(var + node.eps)
    return K.affine(x, mean, scale, beta, node.lay),


kernels.register(BatchNormalization, 'numpy', batch_normalization)
kernels.register(BatchNormalizationGrad, 'numpy', batch_normalization_grad)
kernels.register(FixedBatchNormalization, 'numpy',
                 fixed_batch_normalization)
