"""Per-channel primitives of batch normalization on NumPy arrays.

A :class:`Layout` says where the channels of ``x`` are; the sums, dot
products and broadcast ops here work per channel over such arrays. Sums use
BLAS (a matrix-vector product with a vector of ones, a batched dot
product), which reads the array once without temporaries and is several
times faster than ``ndarray.sum`` over axes (0, 2, 3) of an NCHW array;
channels go in blocks over the kernel's threads (:func:`per_channel`).
``_normalization_kernels.py`` builds the forward and backward from them.
"""
import numpy

from minichain.functions.channel_layout import (  # noqa: F401 (shared)
    Layout, acc_dtype)
from minichain.kernels.numpy import _layout, _parallel

_BLAS_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float64))
# Per-channel work runs in channel blocks of about this many bytes (all
# the arrays a block touches): small enough to stay in a core's L2 between
# the passes, large enough that the NumPy calls are few. Each call costs a
# few microseconds, and more where two threads take turns at Python's lock
# between calls: against 512 KiB, batch normalization of ResNet-50's
# activations ran 5-10% faster on one thread and 10-30% on two (2026-12-01,
# bench/README.md).
_SUM_BLOCK_BYTES = 1 << 20


def as3d(a, lay):
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


def views_of(lay, *arrays):
    """(P, C, L) views of all ``arrays`` in one layout, or None."""
    views = [as3d(a, lay) for a in arrays]
    if any(v is None or v.shape != views[0].shape for v in views):
        return None
    return views


def per_channel(fn, a3, nbytes):
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
    views = views_of(lay, a)
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
    per_channel(block, a3, a.nbytes)
    return s.reshape(lay.cshape)


def channel_dot(a, b, lay):
    """Per-channel sum of ``a * b`` (NumPy), without a temporary when the
    layout allows BLAS."""
    views = views_of(lay, a, b) if a.dtype == b.dtype else None
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
    per_channel(block, a3, 2 * a.nbytes)
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
    views = views_of(lay, a, out)
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
