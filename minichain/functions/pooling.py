"""Pooling: max_pooling_2d, average_pooling_2d, global_average_pooling_2d.

Each body pads the input and loops over the kh*kw kernel offsets (never
over pixels), reading one strided window of the padded input per offset
(``geometry.window``); the fast versions (contiguous phase slices on the
CPU, one CUDA thread per element on the GPU) are kernels registered for
these nodes (``minichain/kernels``).
"""
import numpy

from minichain import backend
from minichain.function_node import FunctionNode
from minichain.functions import geometry
from minichain.functions._check import check_image, check_pair

__all__ = ['max_pooling_2d', 'average_pooling_2d',
           'global_average_pooling_2d']


def _offsets(g):
    """(k, ky, kx) for every kernel offset, k = ky * kw + kx (raster)."""
    return [(ky * g.kw + kx, ky, kx) for ky in range(g.kh)
            for kx in range(g.kw)]


class MaxPooling2D(FunctionNode):
    def __init__(self, g):
        self.g = g

    def forward(self, inputs):
        x, = inputs
        xp = backend.get_array_module(x)
        g = self.g
        xpad = geometry.padded(x, g, -numpy.inf)
        # (kh*kw, N, C, oh, ow): every window's pixels, offset first
        wins = xp.stack([geometry.window(xpad, g, ky, kx)
                         for _, ky, kx in _offsets(g)])
        # argmax takes the first maximum, and the first NaN (as max
        # propagates NaN), so the gradient goes where y came from.
        idx = wins.argmax(axis=0)
        # The argmax indexes stay on self: backward needs them, they are a
        # fraction of y's size, and recomputing them would need x.
        self.indexes = idx.astype(numpy.int32)
        return xp.take_along_axis(wins, idx[None], 0)[0],

    def backward(self, indexes, grad_outputs):
        return MaxPooling2DGrad(self.g, self.indexes).apply(grad_outputs)


class MaxPooling2DGrad(FunctionNode):
    """gx from gy: each gy goes to the pixel its window chose (linear)."""

    def __init__(self, g, indexes):
        self.g, self.indexes = g, indexes

    def forward(self, inputs):
        gy, = inputs
        g = self.g
        return geometry.spread(
            lambda ky, kx: gy * (self.indexes == ky * g.kw + kx), g, gy),

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
        g = self.g
        ggx_pad = geometry.padded(ggx, g)
        out = None
        for k, ky, kx in _offsets(g):  # the masks are disjoint
            part = geometry.window(ggx_pad, g, ky, kx) * (self.indexes == k)
            out = part if out is None else out + part
        return out,

    def backward(self, indexes, grad_outputs):
        return MaxPooling2DGrad(self.g, self.indexes).apply(grad_outputs)


class AveragePooling2D(FunctionNode):
    def __init__(self, g):
        self.g = g

    def forward(self, inputs):
        x, = inputs
        g = self.g
        xpad = geometry.padded(x, g)
        acc = None
        for _, ky, kx in _offsets(g):
            v = geometry.window(xpad, g, ky, kx)
            acc = v.copy() if acc is None else acc + v
        return acc * x.dtype.type(1.0 / (g.kh * g.kw)),

    def backward(self, indexes, grad_outputs):
        return AveragePooling2DGrad(self.g).apply(grad_outputs)


class AveragePooling2DGrad(FunctionNode):
    """gx from gy: gy / (kh*kw) spread over each window (the adjoint)."""

    def __init__(self, g):
        self.g = g

    def forward(self, inputs):
        gy, = inputs
        g = self.g
        part = gy * gy.dtype.type(1.0 / (g.kh * g.kw))
        return geometry.spread(lambda ky, kx: part, g, gy),

    def backward(self, indexes, grad_outputs):
        return AveragePooling2D(self.g).apply(grad_outputs)


def _pool_geometry(func, x, ksize, stride, pad, cover_all):
    xa = check_image(func, x)
    k = check_pair(func, 'ksize', ksize, 1)
    s = k if stride is None else check_pair(func, 'stride', stride, 1)
    p = check_pair(func, 'pad', pad, 0)
    h, w = xa.shape[2:]
    if k[0] > h + 2 * p[0] or k[1] > w + 2 * p[1]:
        raise ValueError('{}: the window {} is larger than the padded input '
                         '({}x{}): x shape {}, pad {}'.format(
                             func, k, h + 2 * p[0], w + 2 * p[1], xa.shape, p))
    out = (geometry.conv_outsize(h, k[0], s[0], p[0], cover_all),
           geometry.conv_outsize(w, k[1], s[1], p[1], cover_all))
    return geometry.Geometry(k[0], k[1], s[0], s[1], p[0], p[1], 1, 1, h, w,
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
    check_image('global_average_pooling_2d', x)
    return GlobalAveragePooling2D().apply((x,))[0]
