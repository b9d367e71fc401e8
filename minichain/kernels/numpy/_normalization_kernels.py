"""Array kernels of batch normalization on NumPy (BLAS reductions).

Everything here works on raw arrays laid out by a :class:`Layout`
(``_channels.py``, with the per-channel sums and broadcast ops); the
FunctionNodes in ``normalization.py`` call these. Per-channel quantities
(mean, inv_std, ...) are arrays of the channel shape ``layout.cshape``.
The CuPy kernels are ``kernels/cuda/normalization.py``.

On the CPU an elementwise NumPy op costs one pass over memory, so the
formulas below are arranged to need few passes and to write into buffers
they already own. ``cpu_forward``, ``cpu_backward`` and ``affine``
run inside :func:`minichain.host.cpu_kernel_scope`: the BLAS sums on one
thread, the elementwise passes split over the kernel's threads.
"""
import numpy

from minichain import host
from minichain.kernels.numpy import _layout, _parallel
from minichain.kernels.numpy._channels import (as3d, channel_dot, channel_op,
                                               channel_sum, per_channel,
                                               views_of)

# When the mean is large against the standard deviation, E[x^2] - mean^2
# cancels. With E[x^2] <= 16 var the rounding error of the one-pass
# variance is amplified at most 16 times, which float32 tolerates.
_ONE_PASS_MAX_RATIO = 16.0


# -- CPU ----------------------------------------------------------------------
def _wide(*arrays):
    return [a.astype(numpy.float32) for a in arrays]


@host.cpu_kernel
def cpu_forward(x, gamma, beta, eps, lay, residual=None, relu=False):
    """Training forward on NumPy.

    float16 is computed in float32 (a pass to widen x, one to narrow y),
    and its statistics stay float32. With ``residual`` (x's shape and
    dtype) it is added to y, and with ``relu`` y becomes ``max(y, 0)``
    (:func:`finish`): the end of a ResNet block, done while each block of
    channels is in cache when the arrays are channel-major.

    Returns:
        ``(y, mean, var, inv_std, centered)``: ``var`` is the biased batch
        variance; ``centered`` tells the backward whether the statistics
        needed ``x - mean`` (see :func:`cpu_backward`).
    """
    if x.dtype == numpy.float16:
        y, *stats = cpu_forward(*_wide(x, gamma, beta), eps, lay)
        y = finish(y.astype(numpy.float16), residual, relu)
        return (y,) + tuple(stats)
    if _by_channels(lay, x):
        if residual is None or _by_channels(lay, x, residual):
            return _forward_by_channels(x, gamma, beta, eps, lay, residual,
                                        relu)
        y, *stats = _forward_by_channels(x, gamma, beta, eps, lay, None,
                                         False)
        return (finish(y, residual, relu),) + tuple(stats)
    m = lay.m
    mean = channel_sum(x, lay) / m
    xc = None
    if as3d(x, lay) is not None:
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
    return finish(y, residual, relu), mean, var, inv_std, xc is not None


def finish(y, residual, relu):
    """In place over y: ``y += residual`` when given, then ``max(y, 0)``
    with ``relu``; in the order of ``F.relu(y + residual)``, so the values
    are those of the separate ops."""
    if residual is not None:
        _parallel.add_into(y, residual)
    if relu:
        zero = y.dtype.type(0)
        _parallel.elementwise(lambda o: numpy.maximum(o, zero, out=o), y)
    return y


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
    if x.dtype == numpy.float16:   # (gamma float16, or mixed16's float32)
        gx, ggamma, gbeta = cpu_backward(*_wide(x, gamma, gy), mean, inv_std,
                                         centered, lay)
        return (gx.astype(x.dtype), ggamma.astype(gamma.dtype),
                gbeta.astype(gamma.dtype))
    if _by_channels(lay, x, gy):
        return _backward_by_channels(x, gamma, gy, mean, inv_std, centered,
                                     lay)
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
    _parallel.add_into(gx, gy)
    channel_op(numpy.multiply, gx, a, lay, out=gx)
    channel_op(numpy.add, gx, a * r, lay, out=gx)
    return gx, ggamma, gbeta


def _by_channels(lay, *arrays):
    """Whether the arrays are channel-major (``_layout.py``): each channel
    one contiguous row, so that a block of channels goes through all the
    passes of batch normalization while it is in cache."""
    views = views_of(lay, *arrays)
    return views is not None and views[0].shape[0] == 1


def _forward_by_channels(x, gamma, beta, eps, lay, residual, relu):
    """:func:`cpu_forward` over blocks of channels of a channel-major x
    (and residual), each block read from memory once. A block takes the
    one-pass variance where it is accurate (as :func:`cpu_forward` does),
    else ``x - mean`` first, and then the backward centers too
    (``centered``)."""
    y = _layout.empty_like_dense(x)
    (_, C, L), m = as3d(x, lay).shape, lay.m
    x2, y2 = as3d(x, lay)[0], as3d(y, lay)[0]
    r2 = None if residual is None else as3d(residual, lay)[0]
    zero = x.dtype.type(0)
    gamma, beta = gamma.reshape(C), beta.reshape(C)
    mean, var, inv_std = (numpy.empty(C, x.dtype) for _ in range(3))
    ones = numpy.ones(L, x.dtype)
    centered = []  # a block that needed x - mean appends to it

    def block(c):
        xs, ys = x2[c], y2[c]
        mean[c] = (xs @ ones) / m
        ex2 = (xs[:, None, :] @ xs[:, :, None]).reshape(-1) / m
        var[c] = ex2 - mean[c] * mean[c]
        if numpy.all(var[c] * _ONE_PASS_MAX_RATIO >= ex2):
            # y = x * scale + (beta - mean * scale): no x - mean pass
            inv_std[c] = 1 / numpy.sqrt(var[c] + eps)
            scale = gamma[c] * inv_std[c]
            numpy.multiply(xs, scale[:, None], out=ys)
            numpy.add(ys, (beta[c] - mean[c] * scale)[:, None], out=ys)
        else:
            centered.append(c)
            xc = numpy.subtract(xs, mean[c, None], out=ys)
            var[c] = (xc[:, None, :] @ xc[:, :, None]).reshape(-1) / m
            inv_std[c] = 1 / numpy.sqrt(var[c] + eps)
            numpy.multiply(xc, (gamma[c] * inv_std[c])[:, None], out=ys)
            numpy.add(ys, beta[c, None], out=ys)
        if r2 is not None:
            numpy.add(ys, r2[c], out=ys)
        if relu:
            numpy.maximum(ys, zero, out=ys)
    # The blocks as without a residual: the same sums, so the same bits as
    # the separate ops.
    per_channel(block, as3d(x, lay), 2 * x.nbytes)
    shape = lay.cshape
    return (y, mean.reshape(shape), var.reshape(shape),
            inv_std.reshape(shape), bool(centered))


def _backward_by_channels(x, gamma, gy, mean, inv_std, centered, lay):
    """:func:`cpu_backward` over blocks of channels of channel-major x and
    gy, each block read from memory once; ``x - mean`` is formed only when
    ``centered`` (else ``sum(gy * x) - mean * sum(gy)``, accurate where the
    forward's one-pass variance was)."""
    gx = _layout.empty_like_dense(x)
    (_, C, L), m = as3d(x, lay).shape, lay.m
    x2, gy2, gx2 = (as3d(a, lay)[0] for a in (x, gy, gx))
    gamma, mean, inv_std = (a.reshape(C) for a in (gamma, mean, inv_std))
    ggamma, gbeta = numpy.empty(C, x.dtype), numpy.empty(C, x.dtype)
    ones = numpy.ones(L, x.dtype)

    def block(c):
        xs, gs, os = x2[c], gy2[c], gx2[c]
        gbeta[c] = gs @ ones
        if centered:
            src, shift = numpy.subtract(xs, mean[c, None], out=os), 0
        else:
            src, shift = xs, mean[c]
        dot = (gs[:, None, :] @ src[:, :, None]).reshape(-1)
        ggamma[c] = inv_std[c] * (dot - shift * gbeta[c])
        q = inv_std[c] * ggamma[c] / m
        a = gamma[c] * inv_std[c]
        # gx = a * (gy - q * (src - shift) - gbeta / m); src - shift = x - mean
        numpy.multiply(src, -q[:, None], out=os)
        numpy.add(os, gs, out=os)
        numpy.multiply(os, a[:, None], out=os)
        numpy.add(os, (a * (q * shift - gbeta[c] / m))[:, None], out=os)
    per_channel(block, as3d(x, lay), 3 * x.nbytes)
    return gx, ggamma.reshape(lay.cshape), gbeta.reshape(lay.cshape)


@host.cpu_kernel
def affine(x, mean, scale, beta, lay):
    """``(x - mean) * scale + beta`` with channel arrays broadcast, as
    ``x * scale + (beta - mean * scale)``: two passes."""
    y = channel_op(numpy.multiply, x, scale, lay)
    return channel_op(numpy.add, y, beta - mean * scale, lay, out=y)
