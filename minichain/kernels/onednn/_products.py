"""Under ``config.fp32_math`` 'bf16', a convolution on small maps as one
matrix product (convolution.py's kernels try these first).

A 1x1 convolution of channels-last arrays is a product of matrices that
are already in memory: x (N, C, H, W) over NHWC memory is the C-ordered
matrix (NHW, C), and likewise y and gy (NHW, O). So

    y  (NHW, O) = x (NHW, C) @ W (O, C)^T   the inner product forward
    gx (NHW, C) = gy (NHW, O) @ W (O, C)    its backward data
    gW (O, C)   = gy (NHW, O)^T @ x (NHW, C) its backward weights

each one oneDNN GEMM (``linear.py``'s plans, bfloat16 factors, float32
sums and results), without a reorder of the activations into a blocked
layout, and with W read as a plain (O, C) matrix: the convolution's
blocked bfloat16 weights cost 0.6-0.7 ns per element to make, the plain
ones 0.2. A stride s reads every s-th pixel: those are copied out first
(and gx is zero elsewhere).

Taken for outputs under ``MAX_PIXELS`` (10x10: where convolution.py's
primitives leave NHWC), where it measured faster than the convolution
primitives (batch 32, 2 threads,
AMD EPYC Zen 4, 2026-12-04; convolution time / product time): the weight
gradient 1.2-1.4x at 7x7, 1.5-1.8x at 4x4, 2.4-3.8x at 2x2 (3.0x the
NumPy kernel that took those in float32), 0.55x at 14x14, which keeps the
convolution's; the strided projections' 0.95x from 14x14 to 7x7, 2.1x
from 7x7 to 4x4, 5.3x from 4x4 to 2x2; forward and backward data 1.0-1.1x
at 7x7 and 4x4, 1.1-1.6x at 2x2.

The weight gradient of a larger window (ResNet's 3x3) is one product too
on outputs under ``COLUMNS_MAX_PIXELS``, over x's columns (im2col: each
output pixel's window, padding zeros included, one row of C*kh*kw),
gW (O, C*kh*kw) = gy^T @ columns: 2.4-2.8x the NumPy kernel's float32
time at 2x2 (which took those), 3.9x from 4x4 to 2x2 with stride 2; at
4x4 0.9x the convolution's (kept).

bfloat16 arrays (mixed16 on the CPU) are taken whatever the switch says,
the float32 results rounded to bfloat16 by the plans, as the
convolution's kernels write them. Elsewhere (other layouts, groups,
dilation, float32 math) these decline and the convolution's kernels run.
"""
import numpy

from minichain.functions import geometry
from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn import _fpmath, linear
from minichain.kernels.onednn._plan import cached

MAX_PIXELS = 100   # outputs under this many pixels: where it pays (above)
COLUMNS_MAX_PIXELS = 9   # the same for a weight gradient over columns


def _takes(node, out_shape, *arrays, limit=MAX_PIXELS):
    """An ungrouped, undilated convolution to output maps under ``limit``
    pixels, of channels-last bfloat16 arrays, or float32 ones under
    'bf16'."""
    dtype = arrays[0].dtype
    return (node.groups == 1 and tuple(node.dilate) == (1, 1)
            and out_shape[2] * out_shape[3] < limit
            and all(a.dtype == dtype and a.size and L.is_channels_last(a)
                    for a in arrays)
            and (L.dt_of(dtype) == L.BF16 or dtype == numpy.float32
                 and _fpmath.mode() == 'bf16'))


def _pointwise(node, w_shape):
    """A 1x1 window without padding: the activations are the matrices."""
    return tuple(w_shape[2:]) == (1, 1) and not any(node.pad)


def _read(node, x):
    """The pixels of x that the windows read (every stride-th)."""
    sh, sw = node.stride
    return x[:, :, ::sh, ::sw]


def _rows(a):
    """(N, C, H, W) channels-last -> the C-ordered (NHW, C) matrix (a
    view; a copy of a strided view)."""
    return numpy.ascontiguousarray(a.transpose(0, 2, 3, 1)).reshape(
        -1, a.shape[1])


def _matrix(W):
    """A 1x1 convolution's (O, C, 1, 1) weights as the C-ordered (O, C)
    matrix the plans read (a copy of any other layout)."""
    return numpy.ascontiguousarray(W.reshape(W.shape[:2]))


def _maps(rows, n, h, w):
    """The (NHW, C) matrix -> (N, C, H, W) channels-last (a view)."""
    return rows.reshape(n, h, w, -1).transpose(0, 3, 1, 2)


def forward(node, x, W, b, out):
    """y = conv(x, W) + b (output maps ``out``) as a product, or None."""
    xs = _read(node, x)
    if not (_pointwise(node, W.shape) and _takes(node, xs.shape, x)
            and xs.shape[2:] == out and W.shape[1] == x.shape[1]
            and W.dtype == x.dtype and (b is None or (
                b.dtype == x.dtype and b.shape == W.shape[:1]))):
        return None
    (n, c, h, w), o, dt = xs.shape, W.shape[0], L.dt_of(x.dtype)
    plan = cached(('pointwise', n * h * w, c, o, b is not None, dt), lambda: (
        linear._forward_plan(n * h * w, c, o, b is not None, 'bf16', dt)))
    if plan is None:
        return None
    node.retain_inputs((0, 1))
    args = {L.ARG_SRC: _rows(xs), L.ARG_WEIGHTS: _matrix(W)}
    if b is not None:
        args[L.ARG_BIAS] = numpy.ascontiguousarray(b)
    return _maps(plan(args)[L.ARG_DST], n, h, w)


def backward_data(node, gy, W, b):
    """gx = conv^T(gy, W) + b as a product, or None."""
    (n, o, h, w), c = gy.shape, W.shape[1]
    gx_shape = (n, c) + tuple(node.outsize)
    read = tuple(-(-size // s) for size, s in zip(node.outsize, node.stride))
    if not (_pointwise(node, W.shape) and _takes(node, gy.shape, gy)
            and read == (h, w) and W.shape[0] == o
            and W.dtype == gy.dtype and (b is None or (
                b.dtype == gy.dtype and b.shape == W.shape[1:2]))):
        return None
    dt = L.dt_of(gy.dtype)
    plan = cached(('pointwise_bwd', n * h * w, c, o, dt), lambda: (
        linear._backward_data_plan(n * h * w, c, o, 'bf16', dt)))
    if plan is None:
        return None
    node.retain_inputs((0, 1))
    gx = _maps(plan({L.ARG_DIFF_DST: _rows(gy), L.ARG_WEIGHTS: _matrix(W)})[
        L.ARG_DIFF_SRC], n, h, w)
    if gx.shape != gx_shape:      # strided: the pixels no window read
        full = L.empty_channels_last(gx_shape, gy.dtype)
        full.fill(0)
        _read(node, full)[...] = gx
        gx = full
    if b is not None:
        gx += b.reshape(1, -1, 1, 1)
    return gx


def grad_w(node, x, gy):
    """gW of the convolution as a product, or None."""
    o, c, kh, kw = node.w_shape
    if x.shape[:2] != (gy.shape[0], c) or gy.shape[1] != o:
        return None     # the body says what is wrong
    if _pointwise(node, node.w_shape):
        x = _read(node, x)
        if not (_takes(node, gy.shape, x, gy)
                and x.shape[2:] == gy.shape[2:]):
            return None
        rows = _rows(x)
    elif (_takes(node, gy.shape, x, gy, limit=COLUMNS_MAX_PIXELS)
            # where windows reach into the padding the body multiplies
            # its zeros by gy (0 * inf is NaN), as the columns do; oneDNN
            # may skip zeros: a gy not all finite is declined, as
            # convolution.py's kernel does
            and (not any(node.pad) or L.finite(gy))):
        rows = _columns(node, x, gy.shape[2:])
        if rows is None:
            return None
    else:
        return None
    n, dt = gy.size // o, L.dt_of(gy.dtype)
    plan = cached(('grad_w_product', n, rows.shape[1], o, dt), lambda: (
        linear._backward_weights_plan(n, rows.shape[1], o, 'bf16', dt)))
    if plan is None:
        return None
    node.retain_inputs((0, 1))
    return plan({L.ARG_SRC: rows, L.ARG_DIFF_DST: _rows(gy)})[
        L.ARG_DIFF_WEIGHTS].reshape(node.w_shape)


def _columns(node, x, out):
    """x's columns: the (N oh ow, C kh kw) matrix of each output pixel's
    window (zeros in the padding), or None where the windows reach past
    the padding (cover_all)."""
    (n, c, h, w), (kh, kw) = x.shape, node.w_shape[2:]
    (sh, sw), (ph, pw), (oh, ow) = node.stride, node.pad, out
    if (oh - 1) * sh + kh > h + 2 * ph or (ow - 1) * sw + kw > w + 2 * pw:
        return None
    g = geometry.Geometry(kh, kw, sh, sw, ph, pw, 1, 1, h, w, oh, ow)
    padded = geometry.padded(x, g)   # the op body's padding and windows
    cols = numpy.empty((n, oh, ow, c, kh, kw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[..., i, j] = geometry.window(padded, g, i, j).transpose(
                0, 2, 3, 1)
    return cols.reshape(n * oh * ow, c * kh * kw)
