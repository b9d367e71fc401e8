"""Array kernels of batch normalization, for NumPy (BLAS reductions) and CuPy.

Everything here works on raw arrays laid out by a :class:`Layout`; the
FunctionNodes in ``normalization.py`` call these. Per-channel quantities
(mean, inv_std, ...) are arrays of the channel shape ``layout.cshape``.

On the CPU an elementwise NumPy op costs one pass over memory, so the
formulas below are arranged to need few passes and to write into buffers
they already own. Per-channel sums use BLAS (a matrix-vector product with a
vector of ones, a batched dot product), which reads the array once without
temporaries and is several times faster than ``ndarray.sum`` over axes
(0, 2, 3) of an NCHW array. ``cpu_forward``, ``cpu_backward`` and ``affine``
run inside :func:`minichain.host.cpu_kernel_scope`: the BLAS sums on one
thread, the elementwise passes split over the kernel's threads.
"""
import numpy

from minichain import backend, host
from minichain.functions import _layout, _parallel

# When the mean is large against the standard deviation, E[x^2] - mean^2
# cancels. With E[x^2] <= 16 var the rounding error of the one-pass
# variance is amplified at most 16 times, which float32 tolerates.
_ONE_PASS_MAX_RATIO = 16.0
_BLAS_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))
# Per-channel sums run in channel blocks of about this many bytes.
_SUM_BLOCK_BYTES = 512 << 10


class Layout:
    """Where the channels of ``x`` are, given the reduced ``axes``.

    Attributes:
        axes: sorted tuple of reduced axes.
        cshape: the channel shape (the shape of gamma).
        bshape: ``x.shape`` with 1 on reduced axes (broadcasts channels).
        m: number of elements per channel.
        view: ``(P, C, L)`` when the channel axes form one contiguous block,
            so that a C-contiguous ``x`` reshapes to it without a copy;
            else None.
    """

    def __init__(self, shape, axes):
        self.shape, self.axes = tuple(shape), tuple(axes)
        kept = [i for i in range(len(shape)) if i not in axes]
        self.cshape = tuple(shape[i] for i in kept)
        self.bshape = tuple(1 if i in axes else s for i, s in enumerate(shape))
        csize = _prod(self.cshape)
        self.m = _prod(shape) // csize if csize else 0
        self.view = None
        if kept and kept == list(range(kept[0], kept[-1] + 1)):
            self.view = (_prod(shape[:kept[0]]), csize,
                         _prod(shape[kept[-1] + 1:]))


def _prod(xs):
    p = 1
    for s in xs:
        p *= int(s)
    return p


def acc_dtype(dtype):
    """The dtype of the statistics and sums for inputs of ``dtype``: half
    precision is accumulated and kept in float32 (as Chainer and cuDNN do;
    a per-channel sum of 200k values near 1 overflows float16)."""
    return numpy.dtype(numpy.float32 if dtype == numpy.float16 else dtype)


def _as3d(a, lay):
    """``a`` as a (P, C, L) view: ``lay.view`` for a C-contiguous array,
    (1, C, N*L) for a channel-major one (``_layout.py``: each channel one
    contiguous row); None for other strides and dtypes."""
    if lay.view is None or a.dtype not in _BLAS_DTYPES:
        return None
    if a.flags.c_contiguous:
        return a.reshape(lay.view)
    if lay.view[0] > 1 and len(lay.cshape) == 1 and lay.axes[:1] == (0,):
        ac = _layout.channel_major(a)
        if ac is not None:
            return ac.reshape(1, lay.cshape[0], -1)
    return None


def _views(lay, *arrays):
    """(P, C, L) views of all ``arrays`` in one layout, or None."""
    views = [_as3d(a, lay) for a in arrays]
    if any(v is None or v.shape != views[0].shape for v in views):
        return None
    return views


def _per_channel(fn, a3, nbytes):
    """``fn(s)`` for consecutive blocks ``s`` of the channels, the blocks
    shared out over the kernel's threads. The blocks depend on the shape
    only, never on the thread count, so that the sums (BLAS rounds a block
    by its own size) are the same on any number of threads."""
    C = a3.shape[1]
    n = min(C, max(1, -(-nbytes // _SUM_BLOCK_BYTES)))
    bounds = [C * i // n for i in range(n + 1)]

    def run(blocks):
        for i in range(blocks.start, blocks.stop):
            fn(slice(bounds[i], bounds[i + 1]))
    _parallel.split_rows(run, n, nbytes)


def channel_sum(a, lay):
    """Per-channel sum of a NumPy array shaped like x."""
    views = _views(lay, a)
    if views is None:
        s = a.sum(axis=lay.axes, dtype=acc_dtype(a.dtype))
        return s.reshape(lay.cshape)
    a3, = views
    P, C, L = a3.shape
    s = numpy.empty(C, a.dtype)
    if L == 1:
        ones = numpy.ones(P, a.dtype)

        def block(c):
            numpy.matmul(ones, a3[:, c, 0], out=s[c])
    else:
        ones = numpy.ones(L, a.dtype)

        def block(c):
            s[c] = (a3[:, c] @ ones).sum(axis=0)
    _per_channel(block, a3, a.nbytes)
    return s.reshape(lay.cshape)


def channel_dot(a, b, lay):
    """Per-channel sum of ``a * b`` (NumPy), without a temporary when the
    layout allows BLAS."""
    views = _views(lay, a, b) if a.dtype == b.dtype else None
    if views is None:
        s = (a * b).sum(axis=lay.axes, dtype=acc_dtype(a.dtype))
        return s.reshape(lay.cshape)
    a3, b3 = views
    P, C, L = a3.shape
    s = numpy.empty(C, a.dtype)
    if L == 1:
        def block(c):
            s[c] = numpy.einsum('pc,pc->c', a3[:, c, 0], b3[:, c, 0])
    else:
        def block(c):
            s[c] = (a3[:, c, None, :] @ b3[:, c, :, None]).reshape(
                P, -1).sum(axis=0)
    _per_channel(block, a3, 2 * a.nbytes)
    return s.reshape(lay.cshape)


def channel_op(ufunc, a, c, lay, out=None):
    """``ufunc(a, c)`` on NumPy with the channel array ``c`` broadcast; a
    fresh result keeps ``a``'s layout.

    Broadcasting ``(1, C, 1, 1)`` against NCHW makes NumPy call its inner
    loop once per (n, c) row, which costs about half a pass more than a
    plain elementwise op. Expanding ``c`` to one ``(C * L)`` row first (a
    small array, ``1/P`` of x) lets the op run over P long rows instead;
    a channel-major ``a`` is C rows of N*L already.
    """
    if out is None:
        out = _layout.empty_like_dense(a)
        if out.dtype != numpy.result_type(a, c):
            out = numpy.empty(a.shape, numpy.result_type(a, c))
    views = _views(lay, a, out)
    if views is None:
        return ufunc(a, c.reshape(lay.bshape), out=out)
    a3, o3 = views
    P, C, L = a3.shape
    if P == 1:
        col = c.reshape(C, 1)
        _parallel.split_rows(lambda s: ufunc(a3[0, s], col[s], out=o3[0, s]),
                             C, 2 * a.nbytes)
    elif L > 1:
        row = numpy.broadcast_to(c.reshape(C, 1), (C, L)).reshape(-1)
        a2, o2 = a3.reshape(P, C * L), o3.reshape(P, C * L)
        _parallel.split_rows(lambda s: ufunc(a2[s], row, out=o2[s]), P,
                             2 * a.nbytes)
    else:
        ufunc(a, c.reshape(lay.bshape), out=out)
    return out


# -- CPU ----------------------------------------------------------------------
def _wide(*arrays):
    return [a.astype(numpy.float32) for a in arrays]


@host.cpu_kernel
def cpu_forward(x, gamma, beta, eps, lay):
    """Training forward on NumPy.

    float16 is computed in float32 (a pass to widen x, one to narrow y),
    and its statistics stay float32.

    Returns:
        ``(y, mean, var, inv_std, centered)``: ``var`` is the biased batch
        variance; ``centered`` tells the backward whether the statistics
        needed ``x - mean`` (see :func:`cpu_backward`).
    """
    if x.dtype == numpy.float16:
        y, *stats = cpu_forward(*_wide(x, gamma, beta), eps, lay)
        return (y.astype(numpy.float16),) + tuple(stats)
    if _by_channels(lay, x):
        return _forward_by_channels(x, gamma, beta, eps, lay)
    m = lay.m
    mean = channel_sum(x, lay) / m
    xc = None
    if _as3d(x, lay) is not None:
        ex2 = channel_dot(x, x, lay) / m
        var = ex2 - mean * mean
        if not numpy.all(var * _ONE_PASS_MAX_RATIO >= ex2):
            xc = channel_op(numpy.subtract, x, mean, lay)
    else:
        xc = channel_op(numpy.subtract, x, mean, lay)
    if xc is not None:
        var = channel_dot(xc, xc, lay) / m
    inv_std = 1 / numpy.sqrt(var + eps)
    scale = gamma * inv_std
    if xc is None:
        y = channel_op(numpy.multiply, x, scale, lay)
        channel_op(numpy.add, y, beta - mean * scale, lay, out=y)
    else:
        y = channel_op(numpy.multiply, xc, scale, lay, out=xc)
        channel_op(numpy.add, y, beta, lay, out=y)
    return y, mean, var, inv_std, xc is not None


@host.cpu_kernel
def cpu_backward(x, gamma, gy, mean, inv_std, centered, lay):
    """Fused gradients ``(gx, ggamma, gbeta)`` on NumPy (textbook formula).

    With ``src = x - shift`` (``shift`` = 0 if ``centered``, else the mean,
    so that ``x - mean`` is only materialized when cancellation demands it):
    ``ggamma = inv_std * (sum(gy * src) - shift * sum(gy))``, ``gbeta =
    sum(gy)``, and ``gx = a * (gy - q * src + r)`` with ``a = gamma *
    inv_std``, ``q = inv_std * ggamma / m``, ``r = q * shift - gbeta / m``.
    float16 is computed in float32, as in :func:`cpu_forward`.
    """
    if x.dtype == numpy.float16:
        x, gamma, gy = _wide(x, gamma, gy)
        grads = cpu_backward(x, gamma, gy, mean, inv_std, centered, lay)
        return tuple(g.astype(numpy.float16) for g in grads)
    if _by_channels(lay, x, gy):
        return _backward_by_channels(x, gamma, gy, mean, inv_std, lay)
    m = lay.m
    gbeta = channel_sum(gy, lay)
    if centered:
        src, shift = channel_op(numpy.subtract, x, mean, lay), 0
    else:
        src, shift = x, mean
    ggamma = inv_std * (channel_dot(gy, src, lay) - shift * gbeta)
    q = inv_std * ggamma / m
    r = q * shift - gbeta / m
    a = gamma * inv_std
    gx = channel_op(numpy.multiply, src, -q, lay,
                    out=src if centered else None)
    _parallel.elementwise(lambda o, g: numpy.add(o, g, out=o), gx, gy)
    channel_op(numpy.multiply, gx, a, lay, out=gx)
    channel_op(numpy.add, gx, a * r, lay, out=gx)
    return gx, ggamma, gbeta


def _by_channels(lay, *arrays):
    """Whether the arrays are channel-major (``_layout.py``): each channel
    one contiguous row, so that a block of channels goes through all the
    passes of batch normalization while it is in cache."""
    views = _views(lay, *arrays)
    return views is not None and views[0].shape[0] == 1


def _forward_by_channels(x, gamma, beta, eps, lay):
    """:func:`cpu_forward` over blocks of channels of a channel-major x,
    each block read from memory once; always two-pass (``x - mean`` costs
    little in cache), hence ``centered``."""
    y = _layout.empty_like_dense(x)
    (_, C, L), m = _as3d(x, lay).shape, lay.m
    x2, y2 = _as3d(x, lay)[0], _as3d(y, lay)[0]
    gamma, beta = gamma.reshape(C), beta.reshape(C)
    mean, var, inv_std = (numpy.empty(C, x.dtype) for _ in range(3))
    ones = numpy.ones(L, x.dtype)

    def block(c):
        xs, ys = x2[c], y2[c]
        mean[c] = (xs @ ones) / m
        xc = numpy.subtract(xs, mean[c, None], out=ys)
        var[c] = (xc[:, None, :] @ xc[:, :, None]).reshape(-1) / m
        inv_std[c] = 1 / numpy.sqrt(var[c] + eps)
        numpy.multiply(xc, (gamma[c] * inv_std[c])[:, None], out=ys)
        numpy.add(ys, beta[c, None], out=ys)
    _per_channel(block, _as3d(x, lay), 2 * x.nbytes)
    shape = lay.cshape
    return (y, mean.reshape(shape), var.reshape(shape),
            inv_std.reshape(shape), True)


def _backward_by_channels(x, gamma, gy, mean, inv_std, lay):
    """:func:`cpu_backward` (centered) over blocks of channels of
    channel-major x and gy, each block read from memory once."""
    gx = _layout.empty_like_dense(x)
    (_, C, L), m = _as3d(x, lay).shape, lay.m
    x2, gy2, gx2 = (_as3d(a, lay)[0] for a in (x, gy, gx))
    gamma, mean, inv_std = (a.reshape(C) for a in (gamma, mean, inv_std))
    ggamma, gbeta = numpy.empty(C, x.dtype), numpy.empty(C, x.dtype)
    ones = numpy.ones(L, x.dtype)

    def block(c):
        xs, gs, os = x2[c], gy2[c], gx2[c]
        gbeta[c] = gs @ ones
        xc = numpy.subtract(xs, mean[c, None], out=os)
        ggamma[c] = inv_std[c] * (gs[:, None, :] @ xc[:, :, None]).reshape(-1)
        q = inv_std[c] * ggamma[c] / m
        a = gamma[c] * inv_std[c]
        numpy.multiply(xc, -q[:, None], out=os)  # gx = a * (gy - q xc + r)
        numpy.add(os, gs, out=os)
        numpy.multiply(os, a[:, None], out=os)
        numpy.add(os, (a * -gbeta[c] / m)[:, None], out=os)
    _per_channel(block, _as3d(x, lay), 3 * x.nbytes)
    return gx, ggamma.reshape(lay.cshape), gbeta.reshape(lay.cshape)


# -- GPU ----------------------------------------------------------------------
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


def gpu_forward(x, gamma, beta, eps, lay):
    """Training forward on CuPy; same results as :func:`cpu_forward`
    (statistics of dtype :func:`acc_dtype`)."""
    cupy = backend.get_cupy()
    k, acc = _kernels(x.dtype), acc_dtype(x.dtype)
    mean = k['sum'](x, axis=lay.axes) / lay.m
    mb, = _channels(lay, acc, mean)
    var = k['sq_dev'](x, mb, axis=lay.axes) / lay.m
    inv_std = 1 / cupy.sqrt(var + eps)
    y = k['fwd'](x, mb, *_channels(lay, acc, gamma * inv_std, beta))
    return y, mean, var, inv_std, True


def gpu_backward(x, gamma, gy, mean, inv_std, centered, lay):
    """Fused gradients on CuPy (the formula of :func:`cpu_backward`, with
    ``x - mean`` computed on the fly inside the kernels)."""
    k, acc = _kernels(x.dtype), acc_dtype(x.dtype)
    m = lay.m
    mb, = _channels(lay, acc, mean)
    gbeta = k['sum'](gy, axis=lay.axes)
    ggamma = inv_std * k['dot_dev'](gy, x, mb, axis=lay.axes)
    q = inv_std * ggamma / m
    a, qb, rb = _channels(lay, acc, gamma * inv_std, q, -gbeta / m)
    gx = k['bwd'](gy, x, mb, a, qb, rb)
    return gx, ggamma.astype(gamma.dtype), gbeta.astype(gamma.dtype)


@host.cpu_kernel
def affine(x, mean, scale, beta, lay):
    """``(x - mean) * scale + beta`` with channel arrays broadcast (one
    fused kernel on CuPy, two passes on NumPy)."""
    xp = backend.get_array_module(x)
    if xp is not numpy:
        return _kernels(x.dtype)['fwd'](
            x, *_channels(lay, acc_dtype(x.dtype), mean, scale, beta))
    y = channel_op(numpy.multiply, x, scale, lay)
    return channel_op(numpy.add, y, beta - mean * scale, lay, out=y)
