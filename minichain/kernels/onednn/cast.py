"""oneDNN kernel of ``Cast`` (functions/array.py) between float32 and
bfloat16: one reorder, the array's layout kept.

What mixed16 on the CPU casts at every step (links/_mixed16.py): each
weight to bfloat16 and its gradient back, and each batch normalization's
input and output. ml_dtypes' ``astype`` converts one element at a time on
one thread; oneDNN's jit reorder rounds the same way (to nearest, ties to
even; NaN stays NaN) on oneDNN's threads: 5.9x at 32x256x32x32, 17x at
512x512x3x3 (2 threads, AMD EPYC Zen 4, 2026-12-05). One difference: the
bfloat16 instruction (AVX512_BF16's vcvtneps2bf16) reads float32
denormals (under 1.2e-38) as zero, where ml_dtypes keeps bfloat16's.

Declined: other dtypes, arrays oneDNN cannot describe (broadcast or
negative strides), empty arrays.
"""
import numpy

from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn._plan import cached


def cast(node, inputs):
    x, = inputs
    out = numpy.dtype(node.dtype)
    if not (x.size and L.describable(x) and L.dt_of(out) is not None
            and out != x.dtype):
        return None
    y = numpy.empty_like(x, dtype=out)   # x's memory order, dense
    plan = cached(('cast', x.shape, x.strides, x.dtype.str, y.strides,
                   out.str), lambda: L.reorder(L.of(x), L.of(y)))
    if plan is None:
        return None
    plan({L.ARG_SRC: x, L.ARG_DST: y})
    return y,
