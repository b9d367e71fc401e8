"""oneDNN kernels of pooling (functions/pooling.py) on C-ordered or
channels-last float32 (or mixed16's bfloat16) arrays (``_plan.py``; the
output in the input's layout): max pooling forward and backward
(ResNet-50's 3x3/2 stem pooling), average pooling forward and backward
(padding counted, as Chainer's), and the global average pooling forward.

Max pooling: oneDNN keeps, per output pixel, the offset ``ky * kw + kx``
in its window of the first maximum (its *workspace*, uint8 up to 255
offsets), which is what the body keeps in ``node.indexes`` and its
backward nodes read: the kernel gives the workspace as ``indexes`` (an
int8 view of it, the NumPy kernels' dtype, up to 127 offsets), and the
backward kernel gives any node's ``indexes`` back to oneDNN as the
workspace. oneDNN's maximum skips NaN where the body's lets it win, and
starts from the lowest float (-3.4e38) where the body's starts from
-inf: an input holding NaN or -inf is declined (one pass: ``x.min()`` is
then NaN or -inf; bfloat16 is read as its bits), so that NaN propagates
and a window of -inf gives -inf, as documented. Its backward adds each
``gy`` to the pixel its window chose, where the body spreads ``gy *
(index == k)`` over the window (NaN wherever ``gy`` is not finite): a
``gy`` that is not finite is declined (one pass, a sum).

Declined: other dtypes, other layouts, a window that can lie
wholly in the padding (cover_all with a stride beyond the window; the
body gives -inf there), the special values above, and geometries oneDNN
refuses.
"""
import numpy

from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn._plan import Plan, cached


def _layout(a):
    """'nchw' for a C-ordered array, 'nhwc' for a channels-last one, None
    for other layouts, dtypes and ranks, or an empty array."""
    if L.dt_of(a.dtype) is None or a.ndim != 4 or not a.size:
        return None
    if a.flags.c_contiguous:
        return 'nchw'
    return 'nhwc' if L.is_channels_last(a) else None


def _md(shape, layout, dtype):
    dt = L.dt_of(numpy.dtype(dtype))
    return (L.channels_last(shape, dt) if layout == 'nhwc' else
            L.plain(shape, dt=dt))


def _nan_or_minus_inf(x):
    """Whether ``x`` holds NaN or -inf (in one pass for float32)."""
    if x.dtype.name == 'bfloat16':
        return L.has_nan(x) or bool((x.view(numpy.uint16) == 0xff80).any())
    return not x.min() > -numpy.inf


def _geometry(g):
    """(strides, kernel, dilation, padding_l, padding_r): oneDNN counts
    dilation from 0 and wants the right padding that makes the sizes
    agree (cover_all makes it larger than the left one); None where a
    window could hold only padding."""
    pad_r = ((g.oh - 1) * g.sy + g.kh - g.h - g.ph,
             (g.ow - 1) * g.sx + g.kw - g.w - g.pw)
    if max(g.ph, pad_r[0]) >= g.kh or max(g.pw, pad_r[1]) >= g.kw:
        return None
    return (g.sy, g.sx), (g.kh, g.kw), (0, 0), (g.ph, g.pw), pad_r


def _forward_pd(alg, x_shape, y_shape, geo, layout, dtype):
    src, dst = _md(x_shape, layout, dtype), _md(y_shape, layout, dtype)
    return L.PrimitiveDesc(
        'dnnl_pooling_forward_primitive_desc_create', L.engine,
        L.FORWARD_TRAINING, alg, src, dst, *map(L.dims, geo), None)


def _forward_plan(alg, x_shape, y_shape, geo, layout='nchw',
                  dtype=numpy.float32):
    pd = _forward_pd(alg, x_shape, y_shape, geo, layout, dtype)
    args = (L.ARG_SRC, L.ARG_DST) + ((L.ARG_WORKSPACE,)
                                     if alg == L.POOLING_MAX else ())
    return Plan(L.Primitive(pd, args), {}, {L.ARG_DST: y_shape},
                channels_last=(L.ARG_DST,) if layout == 'nhwc' else (),
                dtype=dtype)


def _backward_plan(alg, x_shape, y_shape, geo, layout, dtype):
    hint = _forward_pd(alg, x_shape, y_shape, geo, layout, dtype)
    diff_src, diff_dst = (_md(x_shape, layout, dtype),
                          _md(y_shape, layout, dtype))
    pd = L.PrimitiveDesc(
        'dnnl_pooling_backward_primitive_desc_create', L.engine, alg,
        diff_src, diff_dst, *map(L.dims, geo), hint, None)
    args = (L.ARG_DIFF_DST, L.ARG_DIFF_SRC) + ((L.ARG_WORKSPACE,)
                                               if alg == L.POOLING_MAX
                                               else ())
    return Plan(L.Primitive(pd, args), {}, {L.ARG_DIFF_SRC: x_shape},
                channels_last=(L.ARG_DIFF_SRC,) if layout == 'nhwc' else (),
                dtype=dtype)


def _plan(direction, alg, g, a):
    """The plan that pools ``a`` (x forward, gy backward) in its layout;
    None where its layout or the geometry is declined."""
    layout, geo = _layout(a), _geometry(g)
    if layout is None or geo is None:
        return None
    n, c = a.shape[:2]
    x_shape, y_shape = (n, c, g.h, g.w), (n, c, g.oh, g.ow)
    build = _forward_plan if direction == 'fwd' else _backward_plan
    return cached(('pool', direction, alg, x_shape, y_shape, geo, layout,
                   a.dtype.str),
                  lambda: build(alg, x_shape, y_shape, geo, layout, a.dtype))


def _offsets_type(g):
    """The workspace's dtype: uint8 offsets up to 255 of them (oneDNN's
    choice), else int32."""
    return numpy.uint8 if g.kh * g.kw < 256 else numpy.int32


def _indexes(workspace, g):
    """The workspace as ``node.indexes`` in the dtype the NumPy kernels
    use (int8 up to 127 offsets, else int32; they write -1 into copies)."""
    if g.kh * g.kw <= 127:
        return workspace.view(numpy.int8)
    return workspace.astype(numpy.int32, copy=False)


def _workspace(indexes, g, layout):
    """Any node's ``indexes`` (the body's int32, the NumPy kernel's int8,
    this kernel's) as oneDNN's workspace: the same offsets, in the
    layout of the arrays (oneDNN's workspace follows its dst's)."""
    want = _offsets_type(g)
    if layout == 'nhwc':
        indexes = indexes.transpose(0, 2, 3, 1)
    if want == numpy.uint8 and indexes.dtype == numpy.int8:
        return numpy.ascontiguousarray(indexes).view(numpy.uint8)
    return numpy.ascontiguousarray(indexes, want)


# -- max pooling --------------------------------------------------------------
def max_pooling_2d(node, inputs):
    x, = inputs
    g = node.g
    layout = _layout(x)
    if layout is None or _nan_or_minus_inf(x):
        return None
    plan = _plan('fwd', L.POOLING_MAX, g, x)
    if plan is None:
        return None
    n, c = x.shape[:2]
    if layout == 'nhwc':   # indexes[n, c, i, j] over NHWC memory, as y
        indexes = numpy.empty((n, g.oh, g.ow, c), _offsets_type(g)
                              ).transpose(0, 3, 1, 2)
    else:
        indexes = numpy.empty((n, c, g.oh, g.ow), _offsets_type(g))
    y = plan({L.ARG_SRC: x, L.ARG_WORKSPACE: indexes})[L.ARG_DST]
    node.indexes = _indexes(indexes, g)
    return y,


def max_pooling_2d_grad(node, inputs):
    gy, = inputs
    g = node.g
    layout = _layout(gy)
    if layout is None or not L.finite(gy):
        return None
    plan = _plan('bwd', L.POOLING_MAX, g, gy)
    if plan is None:
        return None
    ws = _workspace(node.indexes, g, layout)
    return plan({L.ARG_DIFF_DST: gy, L.ARG_WORKSPACE: ws})[L.ARG_DIFF_SRC],


# -- average pooling ----------------------------------------------------------
def average_pooling_2d(node, inputs):
    x, = inputs
    plan = _plan('fwd', L.POOLING_AVG_INCLUDE_PADDING, node.g, x)
    return None if plan is None else (plan({L.ARG_SRC: x})[L.ARG_DST],)


def average_pooling_2d_grad(node, inputs):
    gy, = inputs
    plan = _plan('bwd', L.POOLING_AVG_INCLUDE_PADDING, node.g, gy)
    return (None if plan is None else
            (plan({L.ARG_DIFF_DST: gy})[L.ARG_DIFF_SRC],))


def global_average_pooling_2d(node, inputs):
    """The mean over each map: an average pooling whose window is the
    map."""
    x, = inputs
    if _layout(x) != 'nchw':
        return None
    n, c, h, w = x.shape
    geo = (h, w), (h, w), (0, 0), (0, 0), (0, 0)
    plan = cached(('gap', x.shape, x.dtype.str), lambda: _forward_plan(
        L.POOLING_AVG_INCLUDE_PADDING, x.shape, (n, c, 1, 1), geo,
        dtype=x.dtype))
    if plan is None:
        return None
    node.x_shape = x.shape
    return plan({L.ARG_SRC: x})[L.ARG_DST],
