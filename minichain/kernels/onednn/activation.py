"""oneDNN kernels of ReLU and its gradient (functions/activation.py):
oneDNN's eltwise ``relu`` forward, and its backward from the output
(``relu_use_dst_for_bwd``, as ``ReLUGrad`` takes ``y``), on C-ordered
float32 arrays. Bit for bit what the bodies compute: ``max(x, 0)`` and
``gy`` where ``y > 0``, else 0 (no sums, nothing rounded).

Declined: other dtypes, arrays not C-ordered (the NumPy kernels keep the
other layouts), and arrays under ``_MIN_SIZE`` elements.
"""
import numpy

from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn._plan import Plan, cached


# Below this many elements the NumPy kernel was as fast or faster (fwd +
# bwd, NumPy / oneDNN: 0.80x at 32x100, 1.00x at 100x100, 1.35x at
# 100x1000; 31 interleaved pairs, 2026-12-02): a call through ctypes
# costs a few microseconds.
_MIN_SIZE = 16384


def _usable(*arrays):
    return all(a.dtype == numpy.float32 and a.flags.c_contiguous
               and a.size >= _MIN_SIZE and a.ndim <= L.MAX_NDIMS
               for a in arrays)


def _forward_pd(shape):
    md = L.plain(shape)
    return L.PrimitiveDesc(
        'dnnl_eltwise_forward_primitive_desc_create',
        lambda pd: L.lib.dnnl_eltwise_forward_primitive_desc_create(
            pd, L.engine, L.FORWARD_TRAINING, L.ELTWISE_RELU_USE_DST, md, md,
            0.0, 0.0, None))


def relu(node, inputs):
    x, = inputs
    if not _usable(x):
        return None
    plan = cached(('relu', x.shape), lambda: Plan(
        L.Primitive(_forward_pd(x.shape), (L.ARG_SRC, L.ARG_DST)), {},
        {L.ARG_DST: x.shape}))
    if plan is None:
        return None
    node.retain_outputs((0,))
    return plan({L.ARG_SRC: x})[L.ARG_DST],


def _backward_plan(shape):
    md = L.plain(shape)
    hint = _forward_pd(shape)
    pd = L.PrimitiveDesc(
        'dnnl_eltwise_backward_primitive_desc_create',
        lambda pd: L.lib.dnnl_eltwise_backward_primitive_desc_create(
            pd, L.engine, L.ELTWISE_RELU_USE_DST, md, md, md, 0.0, 0.0,
            hint, None))
    primitive = L.Primitive(pd, (L.ARG_DST, L.ARG_DIFF_DST, L.ARG_DIFF_SRC))
    return Plan(primitive, {}, {L.ARG_DIFF_SRC: shape})


def relu_grad(node, inputs):
    y, gy = inputs
    if not (_usable(y, gy) and y.shape == gy.shape):
        return None
    plan = cached(('relu_grad', y.shape), lambda: _backward_plan(y.shape))
    if plan is None:
        return None
    node.retain_inputs((0,))
    return plan({L.ARG_DST: y, L.ARG_DIFF_DST: gy})[L.ARG_DIFF_SRC],
