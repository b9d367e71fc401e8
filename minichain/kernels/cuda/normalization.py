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

    ``T`` is the input's dtype, ``G`` gamma's, ``R`` the running
    statistics'; sums, means and per-channel factors are ``acc``, so that a
    float16 input never holds a sum. Four launches a way: two reductions,
    one kernel for all the per-channel arithmetic (and the running
    averages), one pass over x that adds the residual and applies ReLU.
    Also called by ``tests/cuda`` to compile every kernel without a GPU.
    """
    c = {'float32': 'float', 'float64': 'double'}[acc]

    def reduction(in_params, expr, name):
        return cupy.ReductionKernel(
            in_params, acc + ' y', expr, 'a + b', 'y = a', '0',
            'minichain_bn_' + name, reduce_type=c)

    def kernel(in_params, out_params, body, name):
        return cupy.ElementwiseKernel(
            in_params.format(acc), out_params.format(acc),
            body.format(c=c, dev='(({})x - mean)'.format(c)),
            'minichain_bn_' + name)
    relu = 'if (relu && ({c})y < 0) y = (T)0.f;'
    return {
        # per-channel sums of x, (x - mean)^2 and gy * (x - mean), reading
        # the big arrays once and writing no temporaries (sq_dev takes the
        # sum: mean = s / m, as the statistics kernel computes it)
        'sum': reduction('T x', 'x', 'sum'),
        'sq_dev': reduction(
            'T x, {0} s, {0} m'.format(acc),
            '(({0})x - s / m) * (({0})x - s / m)'.format(c), 'sq_dev'),
        'dot_dev': reduction('T gy, T x, {} mean'.format(acc),
                             '({0})gy * (({0})x - mean)'.format(c),
                             'dot_dev'),
        'stats': kernel(
            'G gamma, G beta, {0} s, {0} sq, {0} m, {0} eps, {0} d, '
            '{0} c1, {0} c2', '{0} mean, {0} var, {0} inv_std, {0} scale, '
            '{0} shift, R rm, R rv', """
            mean = s / m;
            var = sq / m;
            inv_std = 1 / sqrt(var + eps);
            scale = ({c})gamma * inv_std;
            shift = ({c})beta;
            rm = (R)(d * ({c})rm + c1 * mean);
            rv = (R)(d * ({c})rv + c2 * var);""", 'stats'),
        'fwd': kernel('T x, {0} mean, {0} scale, {0} beta, bool relu',
                      'T y', 'y = (T)({dev} * scale + beta); ' + relu,
                      'fwd'),
        'fwd_add': kernel(
            'T x, {0} mean, {0} scale, {0} beta, T r, bool relu', 'T y',
            'y = (T)({dev} * scale + beta) + r; ' + relu, 'fwd_add'),
        'bwd_stats': kernel(
            'G gamma, {0} gsum, {0} dot, {0} inv_std, {0} m',
            'G ggamma, G gbeta, {0} a, {0} q, {0} r', """
            const {c} gg = inv_std * dot;
            ggamma = (G)gg;
            gbeta = (G)gsum;
            a = ({c})gamma * inv_std;
            q = inv_std * gg / m;
            r = -gsum / m;""", 'bwd_stats'),
        'bwd': kernel(
            'T gy, T x, {0} mean, {0} a, {0} q, {0} r', 'T gx',
            'gx = (T)(a * (({c})gy - q * {dev} + r))', 'bwd'),
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


def gpu_forward(x, gamma, beta, eps, lay, residual=None, relu=False,
                running=None):
    """Training forward on CuPy: ``(y, mean, var, inv_std, centered)`` as
    the NumPy kernel's ``cpu_forward`` (statistics of dtype
    :func:`acc_dtype`), with ``relu(y + residual)`` in the same pass;
    ``running``: ``(running_mean, running_var, decay)`` to update as
    ``keep_statistics`` does, in the statistics' launch (arrays of gamma's
    dtype), or None."""
    cupy = backend.get_cupy()
    k, acc = _kernels(x.dtype), acc_dtype(x.dtype)
    m = lay.m
    s = k['sum'](x, axis=lay.axes)
    sq = k['sq_dev'](x, *_channels(lay, acc, s), m, axis=lay.axes)
    stats = [cupy.empty(s.shape, acc) for _ in range(5)]
    rm, rv, d = running or (cupy.empty_like(gamma), cupy.empty_like(gamma),
                            0.0)  # (nothing to keep: scratch arrays)
    c2 = (1 - d) * m / (m - 1) if m > 1 else 0.0
    k['stats'](gamma, beta, s, sq, m, eps, d, 1 - d, c2, *stats, rm, rv)
    mean, var, inv_std, scale, shift = stats
    channels = _channels(lay, acc, mean, scale, shift)
    if residual is None:
        y = k['fwd'](x, *channels, relu)
    else:
        y = k['fwd_add'](x, *channels, residual, relu)
    return y, mean, var, inv_std, True


def gpu_backward(x, gamma, gy, mean, inv_std, centered, lay):
    """Fused gradients on CuPy (the formula of the NumPy kernel's
    ``cpu_backward``, with ``x - mean`` computed on the fly inside the
    kernels): two reductions, the per-channel factors, one pass for gx."""
    k, acc = _kernels(x.dtype), acc_dtype(x.dtype)
    mb, = _channels(lay, acc, mean)
    gsum = k['sum'](gy, axis=lay.axes)
    dot = k['dot_dev'](gy, x, mb, axis=lay.axes)
    ggamma, gbeta, a, q, r = k['bwd_stats'](gamma, gsum, dot, inv_std, lay.m)
    gx = k['bwd'](gy, x, mb, *_channels(lay, acc, a, q, r))
    return gx, ggamma, gbeta


def affine(x, mean, scale, beta, lay):
    """``(x - mean) * scale + beta`` with channel arrays broadcast, in one
    fused kernel."""
    return _kernels(x.dtype)['fwd'](
        x, *_channels(lay, acc_dtype(x.dtype), mean, scale, beta), False)


def batch_normalization(node, inputs):
    if not kernels.on_cupy(inputs):
        return None
    x, gamma, beta = inputs[:3]
    residual = inputs[3] if len(inputs) == 4 else None
    if residual is not None and (residual.dtype, residual.shape) != (
            x.dtype, x.shape):
        return None  # (the body's sum broadcasts or promotes)
    rm, rv = node.running_mean, node.running_var
    running = None
    if (rm is not None and rv is not None and node.lay.m > 1
            and kernels.on_cupy((rm, rv))
            and rm.dtype == rv.dtype == gamma.dtype
            and rm.shape == rv.shape == gamma.shape):
        running = rm, rv, node.decay
    y, mean, var, inv_std, centered = gpu_forward(
        x, gamma, beta, node.eps, node.lay, residual, node.relu, running)
    node.keep_statistics(mean, var, inv_std, centered,
                         running=running is None)
    return y,


def batch_normalization_grad(node, inputs):
    if not kernels.on_cupy(inputs):
        return None
    node.retain_inputs(tuple(range(len(inputs))))
    x, gamma, gy = node.masked(inputs)
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
