"""Batch normalization on CuPy: reductions and elementwise kernels that
read the big arrays once and never hold a float16 sum.

Per-channel quantities are arrays of the channel shape ``layout.cshape``
(``functions/channel_layout.py``).
"""
from minichain import backend, kernels
from minichain.functions.channel_layout import acc_dtype
from minichain.functions.normalization import (BatchNormalization,
                                               BatchNormalizationGrad,
                                               FixedBatchNormalization)

_gpu_kernels = {}


def make_kernels(cupy, acc):
    """The CuPy kernels of batch normalization whose statistics are of dtype
    ``acc`` (``'float32'`` for float16 and float32 inputs, ``'float64'``).

    ``T`` is the input's dtype; sums, means and per-channel factors are
    ``acc``, so that a float16 input never holds a sum. Also called by
    ``tests/cuda`` to compile every kernel without a GPU.
    """
    c = {'float32': 'float', 'float64': 'double'}[acc]

    def reduction(in_params, expr, name):
        return cupy.ReductionKernel(
            in_params, acc + ' y', expr, 'a + b', 'y = a', '0',
            'minichain_bn_' + name, reduce_type=c)
    dev = '(({})x - mean)'.format(c)
    return {
        # per-channel sums of (x - mean)^2 and gy * (x - mean), reading
        # the big arrays once and writing no temporaries
        'sq_dev': reduction('T x, {} mean'.format(acc),
                            '{0} * {0}'.format(dev), 'sq_dev'),
        'dot_dev': reduction('T gy, T x, {} mean'.format(acc),
                             '({})gy * {}'.format(c, dev), 'dot_dev'),
        'sum': reduction('T x', 'x', 'sum'),
        'fwd': cupy.ElementwiseKernel(
            'T x, {0} mean, {0} scale, {0} beta'.format(acc), 'T y',
            'y = (T)({} * scale + beta)'.format(dev), 'minichain_bn_fwd'),
        'bwd': cupy.ElementwiseKernel(
            'T gy, T x, {0} mean, {0} a, {0} q, {0} r'.format(acc), 'T gx',
            'gx = (T)(a * (({})gy - q * {} + r))'.format(c, dev),
            'minichain_bn_bwd'),
    }


def _kernels(dtype):
    """The compile-once kernels for inputs of ``dtype``."""
    acc = acc_dtype(dtype).name
    if acc not in _gpu_kernels:
        _gpu_kernels[acc] = make_kernels(backend.get_cupy(), acc)
    return _gpu_kernels[acc]


def _channels(lay, acc, *arrays):
    """Channel arrays as ``acc``, shaped to broadcast against x."""
    return [a.astype(acc, copy=False).reshape(lay.bshape) for a in arrays]


def gpu_forward(x, gamma, beta, eps, lay, residual=None, relu=False):
    """Training forward on CuPy: ``(y, mean, var, inv_std, centered)`` as
    the NumPy kernel's ``cpu_forward`` (statistics of dtype
    :func:`acc_dtype`; ``residual`` and ``relu`` as two more passes, not
    yet fused into the kernel)."""
    cupy = backend.get_cupy()
    k, acc = _kernels(x.dtype), acc_dtype(x.dtype)
    mean = k['sum'](x, axis=lay.axes) / lay.m
    mb, = _channels(lay, acc, mean)
    var = k['sq_dev'](x, mb, axis=lay.axes) / lay.m
    inv_std = 1 / cupy.sqrt(var + eps)
    y = k['fwd'](x, mb, *_channels(lay, acc, gamma * inv_std, beta))
    if residual is not None:
        y += residual
    if relu:
        cupy.maximum(y, y.dtype.type(0), out=y)
    return y, mean, var, inv_std, True


def gpu_backward(x, gamma, gy, mean, inv_std, centered, lay):
    """Fused gradients on CuPy (the formula of the NumPy kernel's
    ``cpu_backward``, with ``x - mean`` computed on the fly inside the
    kernels)."""
    k, acc = _kernels(x.dtype), acc_dtype(x.dtype)
    m = lay.m
    mb, = _channels(lay, acc, mean)
    gbeta = k['sum'](gy, axis=lay.axes)
    ggamma = inv_std * k['dot_dev'](gy, x, mb, axis=lay.axes)
    q = inv_std * ggamma / m
    a, qb, rb = _channels(lay, acc, gamma * inv_std, q, -gbeta / m)
    gx = k['bwd'](gy, x, mb, a, qb, rb)
    return gx, ggamma.astype(gamma.dtype), gbeta.astype(gamma.dtype)


def affine(x, mean, scale, beta, lay):
    """``(x - mean) * scale + beta`` with channel arrays broadcast, in one
    fused kernel."""
    return _kernels(x.dtype)['fwd'](
        x, *_channels(lay, acc_dtype(x.dtype), mean, scale, beta))


def batch_normalization(node, inputs):
    if not kernels.on_cupy(inputs):
        return None
    x, gamma, beta = inputs[:3]
    residual = inputs[3] if len(inputs) == 4 else None
    y, mean, var, inv_std, centered = gpu_forward(
        x, gamma, beta, node.eps, node.lay, residual, node.relu)
    node.keep_statistics(mean, var, inv_std, centered)
    return y,


def batch_normalization_grad(node, inputs):
    if not kernels.on_cupy(inputs):
        return None
    node.retain_inputs((0, 1, 2))
    x, gamma, gy = inputs
    return gpu_backward(x, gamma, gy, node.mean, node.inv_std,
                        node.centered, node.lay)


def fixed_batch_normalization(node, inputs):
    if not kernels.on_cupy(inputs):
        return None
    node.retain_inputs((0, 1, 3, 4))
    x, gamma, beta, mean, var = inputs
    scale = gamma / backend.get_cupy().sqrt(var + node.eps)
    return affine(x, mean, scale, beta, node.lay),


kernels.register(BatchNormalization, 'cuda', batch_normalization)
kernels.register(BatchNormalizationGrad, 'cuda', batch_normalization_grad)
kernels.register(FixedBatchNormalization, 'cuda', fixed_batch_normalization)
