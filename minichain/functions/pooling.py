"""Pooling: max_pooling_2d, average_pooling_2d, global_average_pooling_2d.

The CPU path loops over the kh*kw kernel offsets (never over pixels), each
a contiguous slice of the input's stride phases (see ``_phase_grid``). The
GPU path runs one CUDA thread per output (forward) or input (backward)
element.
"""
import numpy

from minichain import backend
from minichain.function_node import FunctionNode
from minichain.kernels.numpy import _im2col, _layout
from minichain.functions._check import check_float, unwrap
from minichain.kernels.numpy._phase_grid import PhaseGrid

__all__ = ['max_pooling_2d', 'average_pooling_2d',
           'global_average_pooling_2d']


def _cuda():
    from minichain.kernels.cuda import _elementwise as _cuda_kernels
    return _cuda_kernels


def _planes(a):
    """``(planes, swapped)``: pooling treats the N and C axes alike, so a
    channel-major ``a`` (``_layout.py``) is pooled as its C-contiguous
    (C, N, h, w) transpose, and its results are transposed back
    (:func:`_unplane`): they keep its layout, and no copy reorders it."""
    if a.flags.c_contiguous or _layout.channel_major(a) is None:
        return a, False
    return a.swapaxes(0, 1), True


def _as_planes(a, swapped):
    return a.swapaxes(0, 1) if swapped else a


_unplane = _as_planes


class MaxPooling2D(FunctionNode):
    def __init__(self, g):
        self.g = g

    def forward(self, inputs):
        x, = inputs
        if backend.get_array_module(x) is not numpy:
            y, self.indexes = _cuda().max_pool_forward(x, self.g)
            return y,
        x, swap = _planes(x)
        grid = PhaseGrid(self.g)
        ph = grid.split(x, -numpy.inf)
        # Branch-free updates: copyto(where=) with a random mask runs ~10x
        # slower than these arithmetic ones.
        best = idx = mask = step = None
        for k, a, b, shift in grid.offsets:  # raster order: first max wins
            v = grid.window(ph, a, b, shift)
            if best is None:
                best = v.copy()
                itype = numpy.int8 if len(grid.offsets) <= 127 else numpy.int32
                idx = numpy.zeros(best.shape, itype)
                mask = numpy.empty(best.shape, bool)
                step = numpy.empty(best.shape, itype)
                continue
            numpy.greater(v, best, out=mask)
            numpy.maximum(best, v, out=best)
            numpy.subtract(itype(k), idx, out=step)
            numpy.multiply(step, mask, out=step)
            numpy.add(idx, step, out=idx)  # idx = k where v won
        _point_at_first_nan(grid, ph, best, idx)
        # The argmax indexes stay on self: backward needs them, they are a
        # fraction of y's size, and recomputing them would need x.
        self.indexes = _unplane(grid.crop(idx, x.shape[:2]), swap)
        return _unplane(grid.crop(best, x.shape[:2]), swap),

    def backward(self, indexes, grad_outputs):
        return MaxPooling2DGrad(self.g, self.indexes).apply(grad_outputs)


def _point_at_first_nan(grid, ph, best, idx):
    """NaN wins a window, as in NumPy's max and argmax and in cuDNN
    (CUDNN_PROPAGATE_NAN): ``maximum`` already carried NaN into ``best``;
    here ``idx`` is moved to the window's first NaN, so that the gradient
    goes where the NaN came from. One pass over the output when there is
    no NaN."""
    nan = numpy.isnan(best)
    if not nan.any():
        return
    for k, a, b, shift in reversed(grid.offsets):  # the first NaN is set last
        hit = numpy.isnan(grid.window(ph, a, b, shift)) & nan
        idx[hit] = k


class MaxPooling2DGrad(FunctionNode):
    """gx from gy: each gy goes to the pixel its window chose (linear)."""

    def __init__(self, g, indexes):
        self.g, self.indexes = g, indexes

    def forward(self, inputs):
        gy, = inputs
        if backend.get_array_module(gy) is not numpy:
            return _cuda().max_pool_backward(gy, self.indexes, self.g),
        gy, swap = _planes(gy)
        grid = PhaseGrid(self.g)
        gyf = grid.expand(gy, 0)
        idxf = grid.expand(_as_planes(self.indexes, swap), -1)
        acc = numpy.zeros((self.g.sy, self.g.sx) + gyf.shape[:1]
                          + (grid.hq * grid.wq,), gy.dtype)
        mask = numpy.empty(gyf.shape, bool)
        part = numpy.empty(gyf.shape, gy.dtype)
        for k, a, b, shift in grid.offsets:
            dst = grid.window(acc, a, b, shift)
            numpy.equal(idxf, k, out=mask)
            numpy.multiply(gyf, mask, out=part)  # branch-free masked add
            numpy.add(dst, part, out=dst)
        return _unplane(grid.merge(acc, gy.shape[:2] + (self.g.h, self.g.w)),
                        swap),

    def backward(self, indexes, grad_outputs):
        return MaxPooling2DGather(self.g, self.indexes).apply(grad_outputs)


class MaxPooling2DGather(FunctionNode):
    """ggy from ggx: read ggx at each window's chosen pixel.

    The adjoint of MaxPooling2DGrad (so each is the other's backward).
    """

    def __init__(self, g, indexes):
        self.g, self.indexes = g, indexes

    def forward(self, inputs):
        ggx, = inputs
        if backend.get_array_module(ggx) is not numpy:
            return _cuda().max_pool_gather(ggx, self.indexes, self.g),
        ggx, swap = _planes(ggx)
        grid = PhaseGrid(self.g)
        ph = grid.split(ggx, 0)
        idxf = grid.expand(_as_planes(self.indexes, swap), -1)
        out = numpy.zeros(idxf.shape, ggx.dtype)
        part = numpy.empty(idxf.shape, ggx.dtype)
        for k, a, b, shift in grid.offsets:  # the masks are disjoint
            numpy.multiply(grid.window(ph, a, b, shift), idxf == k, out=part)
            numpy.add(out, part, out=out)
        return _unplane(grid.crop(out, ggx.shape[:2]), swap),

    def backward(self, indexes, grad_outputs):
        return MaxPooling2DGrad(self.g, self.indexes).apply(grad_outputs)


class AveragePooling2D(FunctionNode):
    def __init__(self, g):
        self.g = g

    def forward(self, inputs):
        x, = inputs
        if backend.get_array_module(x) is not numpy:
            return _cuda().avg_pool_forward(x, self.g),
        x, swap = _planes(x)
        grid = PhaseGrid(self.g)
        ph = grid.split(x, 0)
        acc = None
        for k, a, b, shift in grid.offsets:
            v = grid.window(ph, a, b, shift)
            acc = v.copy() if acc is None else numpy.add(acc, v, out=acc)
        acc *= x.dtype.type(1.0 / len(grid.offsets))
        return _unplane(grid.crop(acc, x.shape[:2]), swap),

    def backward(self, indexes, grad_outputs):
        return AveragePooling2DGrad(self.g).apply(grad_outputs)


class AveragePooling2DGrad(FunctionNode):
    """gx from gy: gy / (kh*kw) spread over each window (the adjoint)."""

    def __init__(self, g):
        self.g = g

    def forward(self, inputs):
        gy, = inputs
        if backend.get_array_module(gy) is not numpy:
            return _cuda().avg_pool_backward(gy, self.g),
        gy, swap = _planes(gy)
        grid = PhaseGrid(self.g)
        gyf = grid.expand(gy, 0)
        gyf *= gy.dtype.type(1.0 / len(grid.offsets))
        acc = numpy.zeros((self.g.sy, self.g.sx) + gyf.shape[:1]
                          + (grid.hq * grid.wq,), gy.dtype)
        for k, a, b, shift in grid.offsets:
            dst = grid.window(acc, a, b, shift)
            numpy.add(dst, gyf, out=dst)
        return _unplane(grid.merge(acc, gy.shape[:2] + (self.g.h, self.g.w)),
                        swap),

    def backward(self, indexes, grad_outputs):
        return AveragePooling2D(self.g).apply(grad_outputs)


def _pool_geometry(func, x, ksize, stride, pad, cover_all):
    from minichain.functions.convolution import _pair
    xa = unwrap(x)
    check_float(func, xa, 'x')
    if xa.ndim != 4:
        raise ValueError('{}: x must be 4-D (N, C, H, W), got shape {}'
                         .format(func, xa.shape))
    k = _pair(func, 'ksize', ksize, 1)
    s = k if stride is None else _pair(func, 'stride', stride, 1)
    p = _pair(func, 'pad', pad, 0)
    h, w = xa.shape[2:]
    if k[0] > h + 2 * p[0] or k[1] > w + 2 * p[1]:
        raise ValueError('{}: the window {} is larger than the padded input '
                         '({}x{}): x shape {}, pad {}'.format(
                             func, k, h + 2 * p[0], w + 2 * p[1], xa.shape, p))
    out = (_im2col.conv_outsize(h, k[0], s[0], p[0], cover_all),
           _im2col.conv_outsize(w, k[1], s[1], p[1], cover_all))
    return _im2col.Geometry(k[0], k[1], s[0], s[1], p[0], p[1], 1, 1, h, w,
                            out[0], out[1])


def max_pooling_2d(x, ksize, stride=None, pad=0, cover_all=True):
    """Spatial max pooling, NCHW.

    ``y[n, c, i, j] = max_{ky, kx} x_pad[n, c, i*sy + ky, j*sx + kx]``
    where padding counts as -inf. The gradient flows to the first maximum
    of each window (argmax indexes are kept from the forward pass). NaN
    propagates: a window holding NaN gives NaN and sends its gradient to
    its first NaN, on both devices (as NumPy's max and cuDNN do).

    Args:
        x: (N, C, H, W) input.
        ksize: window size, an int or a pair.
        stride: an int or a pair; None means ``ksize``.
        pad: an int or a pair; padded pixels count as -inf.
        cover_all: Chainer's default True adds windows so that every input
            pixel is covered: ``out_h = (H + 2*ph - kh + sy - 1)//sy + 1``
            instead of ``(H + 2*ph - kh)//sy + 1``. A stride much larger
            than the window can then leave a last window that holds only
            padding; its output is -inf and it passes no gradient (as in
            Chainer).
    Returns:
        Variable of shape (N, C, out_h, out_w).
    """
    g = _pool_geometry('max_pooling_2d', x, ksize, stride, pad,
                       bool(cover_all))
    return MaxPooling2D(g).apply((x,))[0]


def average_pooling_2d(x, ksize, stride=None, pad=0):
    """Spatial average pooling, NCHW (Chainer's: zero padding included).

    ``y[n, c, i, j] = sum_{ky, kx} x_pad[n, c, i*sy + ky, j*sx + kx] /
    (kh*kw)``: padded pixels count as zeros and the divisor is always the
    full window size.

    Args:
        x: (N, C, H, W) input.
        ksize: window size, an int or a pair.
        stride: an int or a pair; None means ``ksize``.
        pad: an int or a pair.
    Returns:
        Variable of shape (N, C, out_h, out_w) with
        ``out_h = (H + 2*ph - kh)//sy + 1``.
    """
    g = _pool_geometry('average_pooling_2d', x, ksize, stride, pad, False)
    return AveragePooling2D(g).apply((x,))[0]


class GlobalAveragePooling2D(FunctionNode):
    def forward(self, inputs):
        x, = inputs
        self.x_shape = x.shape
        return x.mean(axis=(2, 3), keepdims=True),

    def backward(self, indexes, grad_outputs):
        from minichain.functions.array import broadcast_to
        h, w = self.x_shape[2:]
        return broadcast_to(grad_outputs[0] * (1.0 / (h * w)), self.x_shape),


def global_average_pooling_2d(x):
    """Mean over the whole feature map, NCHW.

    ``y[n, c, 0, 0] = mean_{i, j} x[n, c, i, j]``: the same as
    ``average_pooling_2d(x, (H, W))``, with the two unit spatial axes kept so
    the result stays a feature map; a following Linear layer flattens them.

    Args:
        x: (N, C, H, W) input.
    Returns:
        Variable of shape (N, C, 1, 1).
    """
    xa = unwrap(x)
    check_float('global_average_pooling_2d', xa, 'x')
    if xa.ndim != 4:
        raise ValueError('global_average_pooling_2d: x must be 4-D '
                         '(N, C, H, W), got shape {}'.format(xa.shape))
    return GlobalAveragePooling2D().apply((x,))[0]
