"""oneDNN's binary add, with the attributes the kernels give it: what the
MomentumSGD update (``optimizers.py``) and the end of a ResNet block
(``normalization.py``: ``relu(bn(x) + residual)``) run on.

A binary primitive is one pass over its operands on oneDNN's threads;
NumPy's ufuncs run on one thread, one pass per ufunc.
"""
import ctypes

import numpy

from minichain.kernels.numpy._layout import flat_views
from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn._plan import cached


class Attr(L.Owned):
    """Primitive attributes that this object owns: one scale per tensor,
    given at execute time, for each argument in ``scales`` (as
    ``ARG_ATTR_SCALES | arg``, a float32 array of one element); with
    ``sum_scale`` a sum post-op, ``dst = sum_scale * dst + result``; with
    ``relu`` a relu post-op, ``dst = max(result, 0)``, last.
    A primitive descriptor copies them when it is created."""
    destroy = 'dnnl_primitive_attr_destroy'

    def __init__(self, scales=(), sum_scale=None, relu=False):
        self.handle = ctypes.c_void_p()
        L.check('dnnl_primitive_attr_create',
                L.lib.dnnl_primitive_attr_create(ctypes.byref(self.handle)))
        for arg in scales:   # mask 0: one scale for the whole tensor
            L.check('dnnl_primitive_attr_set_scales_mask',
                    L.lib.dnnl_primitive_attr_set_scales_mask(
                        self.handle, arg, 0))
        if sum_scale is None and not relu:
            return
        post_ops = ctypes.c_void_p()
        L.check('dnnl_post_ops_create',
                L.lib.dnnl_post_ops_create(ctypes.byref(post_ops)))
        try:
            if sum_scale is not None:  # zero point 0, data type dst's own
                L.check('dnnl_post_ops_append_sum',
                        L.lib.dnnl_post_ops_append_sum(post_ops, sum_scale,
                                                       0, 0))
            if relu:                   # alpha 0 (no leak), beta unused
                L.check('dnnl_post_ops_append_eltwise',
                        L.lib.dnnl_post_ops_append_eltwise(
                            post_ops, L.ELTWISE_RELU, 0.0, 0.0))
            L.check('dnnl_primitive_attr_set_post_ops',
                    L.lib.dnnl_primitive_attr_set_post_ops(self.handle,
                                                           post_ops))
        finally:
            L.lib.dnnl_post_ops_destroy(post_ops)


def binary_add(n, attr=None, scales=(), dt=L.F32):
    """A primitive computing dst = src_0 + src_1 (as ``attr`` scales and
    post-processes them) on flat arrays of ``n`` elements (float32 unless
    ``dt``); the arguments ``scales`` (``ARG_ATTR_SCALES | arg``) take
    one-element float32 arrays at execute time."""
    md = L.plain((n,), dt=dt)
    pd = L.PrimitiveDesc('dnnl_binary_primitive_desc_create', L.engine,
                         L.BINARY_ADD, md, md, md, attr)
    one = L.plain((1,))
    return L.Primitive(pd, (L.ARG_SRC, L.ARG_SRC_1, L.ARG_DST) + scales,
                       mds={arg: one for arg in scales})


# Below this many elements NumPy's add (one thread, no call through
# ctypes) was as fast or faster on arrays in cache (NumPy / oneDNN time,
# channels-last float32, 21 pairs, bench/onednn_ops.py --only add, 2
# threads, AMD EPYC Zen 4, 2026-12-05): 0.37x at 32,768 elements, 0.69x
# at 131,072, 0.94x at 262,144, 1.02-1.06x at 294,912-401,408, 1.23x at
# 524,288, 1.06-1.43x above. In a step its inputs come from memory,
# where NumPy's one thread is slower still: the bf16 ResNet-50 step
# 1.07x (1.05-1.11) at 8 x 224, 1.04x (0.97-1.12) at 32 x 32 (11 pairs).
_MIN_ADD = 2 ** 19


def add(node, inputs):
    """``Add``'s kernel: ``a + b`` for two float32 (or two bfloat16)
    arrays of one shape and one dense layout (the sums of gradients where
    a variable has two consumers, e.g. a residual block's input), one pass
    on oneDNN's threads; the output lies as they do. Declined:
    broadcasting, mixed layouts, other dtypes, fewer than ``_MIN_ADD``
    elements. An IEEE sum either way (bfloat16's rounded once from
    float32, as ml_dtypes' add): the body's values, bit for bit."""
    a, b = inputs
    dt = L.dt_of(a.dtype)
    if not (a.dtype == b.dtype and dt is not None and a.size >= _MIN_ADD):
        return None
    y = numpy.empty_like(a)
    views = flat_views(y, a, b)
    plan = None if views is None else cached(
        ('add', a.size, dt), lambda: binary_add(a.size, dt=dt))
    if plan is None:
        return None
    plan({L.ARG_DST: views[0], L.ARG_SRC: views[1], L.ARG_SRC_1: views[2]})
    node.shapes = (a.shape, b.shape)   # what backward reads, as the body
    return y,
