"""oneDNN kernels of ReLU and its gradient (functions/activation.py):
oneDNN's eltwise ``relu`` forward, and its backward from the output
(``relu_use_dst_for_bwd``, as ``ReLUGrad`` takes ``y``), on C-ordered
or channels-last float32 arrays (all of a call's arrays in one of them;
the output in it too). Bit for bit what the bodies compute: ``max(x, 0)`` and
``gy`` where ``y > 0``, else 0 (no sums, nothing rounded).

Declined: other dtypes, other layouts or a mix (NumPy handles those),
and arrays under ``_MIN_SIZE`` elements.
"""
import numpy

from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn._plan import Plan, cached


# Below this many elements the NumPy kernel was as fast or faster (fwd +
# bwd, NumPy / oneDNN: 0.80x at 32x100, 1.00x at 100x100, 1.35x at
# 100x1000; 31 interleaved pairs, 2026-12-02): a call through ctypes
# costs a few microseconds.
_MIN_SIZE = 16384


def _layout(*arrays):
    """'nchw' when the arrays are all C-ordered, 'nhwc' when all are
    channels-last, else None (then declined), for float32 arrays of at
    least ``_MIN_SIZE`` elements."""
    if not all(a.dtype == numpy.float32 and a.size >= _MIN_SIZE
               and a.ndim <= L.MAX_NDIMS for a in arrays):
        return None
    if all(a.flags.c_contiguous for a in arrays):
        return 'nchw'
    if all(L.is_channels_last(a) for a in arrays):
        return 'nhwc'
    return None


def _md(shape, layout):
    return L.channels_last(shape) if layout == 'nhwc' else L.plain(shape)


def _out(layout):
    return (L.ARG_DST, L.ARG_DIFF_SRC) if layout == 'nhwc' else ()


def _forward_pd(shape, layout):
    md = _md(shape, layout)
    return L.PrimitiveDesc(
        'dnnl_eltwise_forward_primitive_desc_create',
        lambda pd: L.lib.dnnl_eltwise_forward_primitive_desc_create(
            pd, L.engine, L.FORWARD_TRAINING, L.ELTWISE_RELU_USE_DST, md, md,
            0.0, 0.0, None))


def relu(node, inputs):
    x, = inputs
    layout = _layout(x)
    if layout is None:
        return None
    plan = cached(('relu', x.shape, layout), lambda: Plan(
        L.Primitive(_forward_pd(x.shape, layout), (L.ARG_SRC, L.ARG_DST)),
        {}, {L.ARG_DST: x.shape}, channels_last=_out(layout)))
    if plan is None:
        return None
    node.retain_outputs((0,))
    return plan({L.ARG_SRC: x})[L.ARG_DST],


def _backward_plan(shape, layout):
    md = _md(shape, layout)
    hint = _forward_pd(shape, layout)
    pd = L.PrimitiveDesc(
        'dnnl_eltwise_backward_primitive_desc_create',
        lambda pd: L.lib.dnnl_eltwise_backward_primitive_desc_create(
            pd, L.engine, L.ELTWISE_RELU_USE_DST, md, md, md, 0.0, 0.0,
            hint, None))
    primitive = L.Primitive(pd, (L.ARG_DST, L.ARG_DIFF_DST, L.ARG_DIFF_SRC))
    return Plan(primitive, {}, {L.ARG_DIFF_SRC: shape},
                channels_last=_out(layout))


def relu_grad(node, inputs):
    y, gy = inputs
    layout = _layout(y, gy)
    if layout is None or y.shape != gy.shape:
        return None
    plan = cached(('relu_grad', y.shape, layout),
                  lambda: _backward_plan(y.shape, layout))
    if plan is None:
        return None
    node.retain_inputs((0,))
    return plan({L.ARG_DST: y, L.ARG_DIFF_DST: gy})[L.ARG_DIFF_SRC],
