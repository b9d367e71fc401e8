"""oneDNN kernels of the fully connected layer, as oneDNN's inner product
on 2-D C-ordered float32 arrays (what ResNet-50's classifier runs):

- ``LinearFunction`` (functions/linear.py), ``y = x W^T + b``: the inner
  product forward (``x``: (N, I), ``W``: (O, I));
- ``MatMul`` (functions/basic_math.py), which linear's backward applies:
  ``gx = gy @ W`` is the inner product's backward data (``gy``: (N, O)),
  and ``gW = gy^T @ x`` its backward weights (``gy^T`` reaches MatMul as
  the transposed view of a C-ordered ``gy``). Any other 2-D product of
  C-ordered operands is a backward data too.

Declined: other dtypes and dimensions, other layouts, empty arrays.
Under ``config.fp32_math`` 'bf16' the two factors are read in bfloat16
(``_fpmath.py``): each plan rounds them on the way in. bfloat16 arrays
(``ml_dtypes``, mixed16's activations on the CPU) are taken as they are,
the float32 result rounded to bfloat16 as the body's (by the plan's
reorder, on oneDNN's threads).
"""
import numpy

from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn import _fpmath
from minichain.kernels.onednn._plan import Plan, cached


def _usable(*arrays):
    return all(a.dtype == arrays[0].dtype and a.ndim == 2 and a.size
               for a in arrays) and L.dt_of(arrays[0].dtype) is not None


def _math(dtype):
    """The math of a product of ``dtype`` arrays: bfloat16 arrays are
    bfloat16 whatever the switch says."""
    return 'bf16' if dtype != numpy.float32 else _fpmath.mode()


def _mds(n, i, o, math, out):
    """The primitive's mds of (x, W, y) (shapes (n, i), (o, i), (n, o)):
    the two factors in ``math``'s data type, position ``out`` (what the
    primitive writes) float32."""
    low = _fpmath.dt(math)
    return tuple(L.plain(shape, dt=L.F32 if k == out else low)
                 for k, shape in enumerate(((n, i), (o, i), (n, o))))


def _user(dt, **shapes):
    """{DNNL_ARG_<NAME>: the md of a C-ordered array of data type
    ``dt``}: what the plan reorders (rounds to bfloat16) into the
    primitive's mds."""
    return {getattr(L, 'ARG_' + name): L.plain(shape, dt=dt)
            for name, shape in shapes.items()}


def _forward_pd(n, i, o, bias, math, dt=L.F32):
    src, w, dst = _mds(n, i, o, math, 2)
    b = L.plain((o,), dt=dt) if bias else None
    return L.PrimitiveDesc(
        'dnnl_inner_product_forward_primitive_desc_create', L.engine,
        L.FORWARD_TRAINING, src, w, b, dst, None)


def _forward_plan(n, i, o, bias, math, dt):
    args = (L.ARG_SRC, L.ARG_WEIGHTS, L.ARG_DST) + ((L.ARG_BIAS,) if bias
                                                    else ())
    return Plan(L.Primitive(_forward_pd(n, i, o, bias, math, dt), args),
                _user(dt, SRC=(n, i), WEIGHTS=(o, i)), {L.ARG_DST: (n, o)},
                dtype=L.dtype_of(dt))


def linear(node, inputs):
    x, W = inputs[:2]
    b = inputs[2] if len(inputs) == 3 else None
    if not (_usable(x, W) and x.flags.c_contiguous and W.flags.c_contiguous
            and x.shape[1] == W.shape[1]
            and (b is None or (b.dtype == x.dtype and b.ndim == 1
                               and b.flags.c_contiguous))):
        return None
    (n, i), o = x.shape, W.shape[0]
    math, dt = _math(x.dtype), L.dt_of(x.dtype)
    plan = cached(('linear', n, i, o, b is not None, math, dt),
                  lambda: _forward_plan(n, i, o, b is not None, math, dt))
    if plan is None:
        return None
    node.retain_inputs((0, 1))
    args = {L.ARG_SRC: x, L.ARG_WEIGHTS: W}
    if b is not None:
        args[L.ARG_BIAS] = b
    return plan(args)[L.ARG_DST],


def _backward_data_plan(n, i, o, math, dt):
    diff_src, w, diff_dst = _mds(n, i, o, math, 0)
    hint = _forward_pd(n, i, o, False, math)
    pd = L.PrimitiveDesc(
        'dnnl_inner_product_backward_data_primitive_desc_create', L.engine,
        diff_src, w, diff_dst, hint, None)
    return Plan(L.Primitive(pd, (L.ARG_DIFF_DST, L.ARG_WEIGHTS,
                                 L.ARG_DIFF_SRC)),
                _user(dt, DIFF_DST=(n, o), WEIGHTS=(o, i)),
                {L.ARG_DIFF_SRC: (n, i)}, dtype=L.dtype_of(dt))


def _backward_weights_plan(n, i, o, math, dt):
    src, diff_w, diff_dst = _mds(n, i, o, math, 1)
    hint = _forward_pd(n, i, o, False, math)
    pd = L.PrimitiveDesc(
        'dnnl_inner_product_backward_weights_primitive_desc_create', L.engine,
        src, diff_w, None, diff_dst, hint, None)
    return Plan(L.Primitive(pd, (L.ARG_SRC, L.ARG_DIFF_DST,
                                 L.ARG_DIFF_WEIGHTS)),
                _user(dt, SRC=(n, i), DIFF_DST=(n, o)),
                {L.ARG_DIFF_WEIGHTS: (o, i)}, dtype=L.dtype_of(dt))


def matmul(node, inputs):
    a, b = inputs
    if not (_usable(a, b) and b.flags.c_contiguous
            and a.shape[1] == b.shape[0]):
        return None
    math, dt = _math(a.dtype), L.dt_of(a.dtype)
    if a.flags.c_contiguous:     # gx = gy @ W: gy (N, O), W (O, I)
        (n, o), i = a.shape, b.shape[1]
        plan = cached(('linear_bwd_data', n, i, o, math, dt),
                      lambda: _backward_data_plan(n, i, o, math, dt))
        args, out = {L.ARG_DIFF_DST: a, L.ARG_WEIGHTS: b}, L.ARG_DIFF_SRC
    elif a.T.flags.c_contiguous:  # gW = gy^T @ x: gy (N, O), x (N, I)
        (o, n), i = a.shape, b.shape[1]
        plan = cached(('linear_bwd_weights', n, i, o, math, dt),
                      lambda: _backward_weights_plan(n, i, o, math, dt))
        args, out = {L.ARG_DIFF_DST: a.T, L.ARG_SRC: b}, L.ARG_DIFF_WEIGHTS
    else:
        return None
    if plan is None:
        return None
    node.retain_inputs((0, 1))
    return plan(args)[out],
