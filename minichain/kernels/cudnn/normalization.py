"""Batch normalization on cuDNN: training forward, its gradient, and the
inference forward, per channel over (N, H, W) ("spatial" mode).

The kernels take CuPy float16 or float32 ``x`` of shape (N, C, H, W) or
(N, C) with gamma of shape (C,), and ``eps`` at least cuDNN's minimum
(1e-5). cuDNN keeps the per-channel quantities in float32 (those of a
float16 ``x`` too, as the body does): gamma and beta are passed as
float32, the gradients of gamma and beta cast back. The running averages
are the node's (``keep_statistics``: cuDNN's are not asked for), so the
unbiased variance and the decay are the body's exactly. A residual and a
ReLU are two more passes here, as in the CuPy kernel.
"""
import ctypes

import numpy

from minichain import backend, kernels
from minichain.functions import normalization as _norm
from minichain.kernels.cudnn import _lib

_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)
_F32 = numpy.dtype(numpy.float32)


def fits(node, x, *others):
    """Whether cuDNN's spatial batch normalization computes this node."""
    spatial = {2: (0,), 4: (0, 2, 3)}.get(x.ndim)
    return (kernels.on_cupy((x,) + others)
            and x.dtype in _lib.DATA and node.lay.axes == spatial
            and node.eps >= _lib.BN_MIN_EPSILON)


def _setup(x):
    """``(handle, x's descriptor, the channels' descriptor)``."""
    cupy = backend.get_cupy()
    xd = _lib.tensor_desc(x.shape, x.dtype)
    h = _lib.handle(x.device.id, cupy.cuda.get_current_stream().ptr)
    return h, xd, _lib.bn_desc(xd)


def _f32(*arrays):
    return [backend.get_array_module(a).ascontiguousarray(a, dtype=_F32)
            for a in arrays]


def batch_normalization(node, inputs):
    """``BatchNormalization.forward`` (training): y, and the batch's mean
    and inverse standard deviation kept for backward."""
    x, gamma, beta = inputs[:3]
    if not fits(node, x):
        return None
    xp = backend.get_array_module(x)
    x = xp.ascontiguousarray(x)
    with x.device:  # cuDNN runs on the current device
        h, xd, cd = _setup(x)
        g, b = _f32(gamma, beta)
        y = xp.empty_like(x)
        mean, inv_std = (xp.empty(gamma.shape, _F32) for _ in range(2))
        _lib.call('cudnnBatchNormalizationForwardTraining', h,
                  _lib.BATCHNORM_SPATIAL, ctypes.addressof(_ONE),
                  ctypes.addressof(_ZERO), xd, x.data.ptr, xd, y.data.ptr, cd,
                  g.data.ptr, b.data.ptr, 0.0, None, None, node.eps,
                  mean.data.ptr, inv_std.data.ptr, where=str(x.shape))
    if len(inputs) == 4:
        y += inputs[3]
    if node.relu:
        xp.maximum(y, y.dtype.type(0), out=y)
    var = inv_std ** -2 - _F32.type(node.eps)   # cuDNN keeps 1/sqrt(v+eps)
    node.keep_statistics(mean, var, inv_std, True)
    return y,


def batch_normalization_grad(node, inputs):
    """``BatchNormalizationGrad.forward``: (gx, ggamma, gbeta) from the
    statistics the forward kept (whichever kernel computed them), with y
    from gy masked as the body masks it (``node.masked``)."""
    x, gamma, gy = inputs[:3]
    if not fits(node, x, *inputs[2:]) or x.dtype != gy.dtype:
        return None
    node.retain_inputs(tuple(range(len(inputs))))
    x, gamma, gy = node.masked(inputs)
    xp = backend.get_array_module(x)
    x, gy = xp.ascontiguousarray(x), xp.ascontiguousarray(gy)
    with x.device:  # cuDNN runs on the current device
        h, xd, cd = _setup(x)
        g, mean, inv_std = _f32(gamma, node.mean, node.inv_std)
        gx = xp.empty_like(x)
        ggamma, gbeta = (xp.empty(gamma.shape, _F32) for _ in range(2))
        one, zero = ctypes.addressof(_ONE), ctypes.addressof(_ZERO)
        _lib.call('cudnnBatchNormalizationBackward', h, _lib.BATCHNORM_SPATIAL,
                  one, zero, one, zero, xd, x.data.ptr, xd, gy.data.ptr, xd,
                  gx.data.ptr, cd, g.data.ptr, ggamma.data.ptr, gbeta.data.ptr,
                  node.eps, mean.data.ptr, inv_std.data.ptr, where=str(x.shape))
    return (gx, ggamma.astype(gamma.dtype, copy=False),
            gbeta.astype(gamma.dtype, copy=False))


def fixed_batch_normalization(node, inputs):
    """``FixedBatchNormalization.forward`` (inference): the given mean and
    variance."""
    x = inputs[0]
    if not fits(node, *inputs):
        return None
    node.retain_inputs((0, 1, 3, 4))
    xp = backend.get_array_module(x)
    x = xp.ascontiguousarray(x)
    with x.device:  # cuDNN runs on the current device
        h, xd, cd = _setup(x)
        g, b, mean, var = _f32(*inputs[1:])
        y = xp.empty_like(x)
        _lib.call('cudnnBatchNormalizationForwardInference', h,
                  _lib.BATCHNORM_SPATIAL, ctypes.addressof(_ONE),
                  ctypes.addressof(_ZERO), xd, x.data.ptr, xd, y.data.ptr, cd,
                  g.data.ptr, b.data.ptr, mean.data.ptr, var.data.ptr, node.eps,
                  where=str(x.shape))
    return y,


KERNELS = {_norm.BatchNormalization: batch_normalization,
           _norm.BatchNormalizationGrad: batch_normalization_grad,
           _norm.FixedBatchNormalization: fixed_batch_normalization}
