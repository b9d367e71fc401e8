"""oneDNN kernels of ReLU and its gradient (functions/activation.py):
oneDNN's eltwise ``relu`` forward, and its backward from the output
(``relu_use_dst_for_bwd``, as ``ReLUGrad`` takes ``y``), on float32 (or
mixed16's bfloat16) arrays in any dense layout (C-ordered, the
channels-last arrays of the oneDNN kernels, the channel-major ones of
the NumPy kernels). The output takes the layout of ``x`` (forward) or
``y`` (backward); a ``gy`` in another layout is reordered into y's
first. Why: where the oneDNN and NumPy kernels meet (the last stage on
small maps runs on NumPy), a gradient sums two layouts and NumPy returns
that sum C-ordered; handed on as it came, the C order would follow the
identity shortcuts down a whole stage, every op there mixing layouts.
Bit for bit what the bodies compute: ``max(x, 0)`` and ``gy * (y > 0)``
(no sums, nothing rounded), where they take the arrays.

oneDNN's relu turns NaN into 0, where the body's ``maximum`` keeps it
(and a NaN stop downstream needs to see it); its backward multiplies
``gy`` by 1 where ``y`` is NaN, where the body's ``y > 0`` is False. So
each kernel declines an ``x`` (forward) or ``y`` (backward) holding NaN:
one pass, ``x.max()`` is then NaN (bfloat16: its bits). It reads an
array that the primitive reads anyway: 8-13% of the backward's time at
the main job's sizes, where it is in cache, 19% at 8x64x112x112
(bench/onednn_checks.py).

Declined: other dtypes, arrays with gaps or broadcast (zero) strides
(but a gy, which is copied),
arrays under ``_MIN_SIZE`` elements, and the special values above.
"""
import numpy

from minichain.kernels.numpy._layout import dense_order
from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn._plan import cached


# Below this many elements the NumPy kernel was as fast or faster (fwd +
# bwd, NumPy / oneDNN: 0.80x at 32x100, 1.00x at 100x100, 1.35x at
# 100x1000; 31 interleaved pairs, 2026-12-02): a call through ctypes
# costs a few microseconds.
_MIN_SIZE = 16384


def _dense(a):
    """Whether ``a`` is a float32 (or bfloat16) array of at least
    ``_MIN_SIZE`` elements over one dense block of memory, in any order of
    its axes."""
    return (L.dt_of(a.dtype) is not None and a.size >= max(_MIN_SIZE, 1)
            and a.ndim <= L.MAX_NDIMS and dense_order(a) is not None)


def _forward_pd(md):
    return L.PrimitiveDesc(
        'dnnl_eltwise_forward_primitive_desc_create', L.engine,
        L.FORWARD_TRAINING, L.ELTWISE_RELU_USE_DST, md, md, 0.0, 0.0, None)


def relu(node, inputs):
    x, = inputs
    if not _dense(x) or L.has_nan(x):
        return None
    primitive = cached(('relu', x.shape, x.strides, x.dtype.str),
                       lambda: L.Primitive(_forward_pd(L.of(x)),
                                           (L.ARG_SRC, L.ARG_DST)))
    if primitive is None:
        return None
    y = numpy.empty_like(x)   # x's layout: the same md
    primitive({L.ARG_SRC: x, L.ARG_DST: y})
    node.retain_outputs((0,))
    return y,


def _backward_primitive(y_md):
    hint = _forward_pd(y_md)
    pd = L.PrimitiveDesc(
        'dnnl_eltwise_backward_primitive_desc_create', L.engine,
        L.ELTWISE_RELU_USE_DST, y_md, y_md, y_md, 0.0, 0.0, hint, None)
    return L.Primitive(pd, (L.ARG_DST, L.ARG_DIFF_DST, L.ARG_DIFF_SRC))


def relu_grad(node, inputs):
    y, gy = inputs
    if not (_dense(y) and y.shape == gy.shape
            and gy.dtype == y.dtype) or L.has_nan(y):
        return None
    primitive = cached(('relu_grad', y.shape, y.strides, y.dtype.str),
                       lambda: _backward_primitive(L.of(y)))
    if primitive is None:
        return None
    if not L.describable(gy):
        # a broadcast gy (a global average pooling's backward), copied
        # into y's layout: the body's product on it was 20 ms of a mixed16
        # step at 8 x 224 (ml_dtypes' multiply on one thread)
        inner = numpy.empty_like(y)
        numpy.copyto(inner, gy)
        gy = inner
    elif gy.strides != y.strides:
        reorder = cached(('relu_grad_gy', y.shape, y.strides, gy.strides,
                          y.dtype.str),
                         lambda: L.reorder(L.of(gy), L.of(y)))
        if reorder is None:
            return None
        inner = numpy.empty_like(y)
        reorder({L.ARG_SRC: gy, L.ARG_DST: inner})
        gy = inner
    node.retain_inputs((0,))
    gx = numpy.empty_like(y)
    primitive({L.ARG_DST: y, L.ARG_DIFF_DST: gy, L.ARG_DIFF_SRC: gx})
    return gx,
