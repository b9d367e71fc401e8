"""oneDNN kernels of batch normalization (``BatchNormalization``,
``BatchNormalizationGrad`` and, for inference, ``FixedBatchNormalization``
in functions/normalization.py), on channels-last float32 arrays: the
layout the oneDNN convolutions return (``_plan.py``), on which oneDNN's
jit code runs without a reorder (how much faster: ``__init__.py``).
x in any other layout is declined: on NCHW oneDNN has only a generic loop,
and reordering in and out of its blocked layout at each call cost more
than it saved (0.23-0.82x the NumPy kernel, an earlier version).

The forward fuses what oneDNN can of what ends a ResNet block:
``relu=True`` without a residual is its ``fuse_norm_relu`` flag; a
residual (and the relu after it) is a second primitive, a binary add
with a relu post-op in place (``_binary.py``), since oneDNN 3.2's CPU
code has no ``fuse_norm_add_relu`` in any layout (status unimplemented):
one threaded pass where NumPy's add and maximum made two on one thread
(the residual batch normalizations of a ResNet-50 bf16 step at batch 8 /
224: 49 -> 38 ms). Like the body, the kernel leaves on the node the
per-channel ``mean`` and ``inv_std`` that the backward reads, and
updates the running statistics in place. With the fused relu it also
leaves oneDNN's relu mask (``relu_workspace``), from which the backward
masks gy inside its own pass (``BatchNormalizationGrad`` given y:
relu's backward and batch normalization's in one node) where a separate
``ReLUGrad`` read y and gy and wrote gx (the same step: ReLUGrad 40 ->
22 ms, BatchNormalizationGrad 65 -> 69 ms).

bfloat16 x (mixed16 on the CPU; its gy and residual bfloat16 too) is
read and written as it is, with float32 gamma, beta and statistics, as
oneDNN's bfloat16 batch normalization takes them: 1.4-3.8x the float32
primitive's speed at ResNet-50's shapes (half the bytes; 2 threads, AMD
EPYC Zen 4, 2026-12-05), where mixed16 cast x to float32 and y back.

Declined: other dtypes, other ranks than 4, reduced axes other than all
but the channel axis, x not channels-last, per-channel parameters that
are not finite (as the NumPy kernels: their formula is not the body's),
and a NaN hidden by the fused relu (below).
"""
import numpy

from minichain.kernels.numpy._layout import flat_views
from minichain.kernels.numpy.normalization import finite
from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn._binary import Attr, binary_add
from minichain.kernels.onednn._plan import Plan, cached

_SCALE_SHIFT = L.USE_SCALE | L.USE_SHIFT


def _usable(lay, x, params, others=()):
    """Channels-last float32 or bfloat16 x normalized per channel, its
    per-channel float32 ``params`` C-ordered (oneDNN reads them as they
    lie), ``others`` of x's dtype in any layout oneDNN can describe."""
    return (x.ndim == 4 and lay.axes == (0, 2, 3) and L.is_channels_last(x)
            and L.dt_of(x.dtype) is not None
            and all(a.dtype == numpy.float32 and a.flags.c_contiguous
                    for a in params)
            and all(a.dtype == x.dtype and L.describable(a) for a in others))


def _forward_pd(shape, eps, flags, prop=L.FORWARD_TRAINING, dt=L.F32):
    md = L.channels_last(shape, dt)
    return L.PrimitiveDesc(
        'dnnl_batch_normalization_forward_primitive_desc_create', L.engine,
        prop, md, md, eps, flags, None)


def batch_normalization(node, inputs):
    x, gamma, beta = inputs[:3]
    residual = inputs[3] if len(inputs) == 4 else None
    if not (_usable(node.lay, x, (gamma, beta),
                    () if residual is None else (residual,))
            and finite(gamma, beta)):
        return None
    # oneDNN 3.2's CPU code fuses relu but no residual add (see above)
    flags = _SCALE_SHIFT | (L.FUSE_NORM_RELU if node.relu and residual is None
                            else 0)
    plan = cached(('bn', x.shape, float(node.eps), flags, x.dtype.str),
                  lambda: _forward_plan(x.shape, node.eps, flags,
                                        dtype=x.dtype))
    if plan is None:
        return None
    c = x.shape[1]
    mean, var = numpy.empty(c, numpy.float32), numpy.empty(c, numpy.float32)
    args = {L.ARG_SRC: x, L.ARG_SCALE: gamma, L.ARG_SHIFT: beta,
            L.ARG_MEAN: mean, L.ARG_VARIANCE: var}
    workspace = None
    if flags & L.FUSE_NORM_RELU:
        # relu's mask, which batch_normalization_grad reads where the
        # body's backward reads y's sign (one pass over y less)
        workspace = args[L.ARG_WORKSPACE] = L.buffer(
            plan.md(L.ARG_WORKSPACE))
    y = plan(args)[L.ARG_DST]
    # float64 on the way, as the body's one-pass variance is not: the
    # statistics then agree with the body's to float32 rounding.
    inv_std = (1.0 / numpy.sqrt(var.astype(numpy.float64)
                                + node.eps)).astype(numpy.float32)
    if flags & L.FUSE_NORM_RELU and not finite(mean, var):
        # oneDNN's fused relu turned any NaN of y into 0, and the body's y
        # may hold NaN where the statistics are not finite: x's NaN or inf
        # (then the mean is not finite), or x - mean overflowing (then the
        # variance is inf, and inv_std 0 gives inf * 0). With both finite,
        # x - mean and the scale are finite and y holds no NaN (short of
        # products overflowing float32), so the workspace oneDNN wrote is
        # y > 0 of the y returned: the mask the body's backward takes.
        return None
    if residual is not None and not _add_residual(y, residual, node.relu):
        # In the order of the body (bn, + residual, relu): same values.
        numpy.add(y, residual, out=y)
        if node.relu:
            numpy.maximum(y, y.dtype.type(0), out=y)
    # centered: the body's backward then forms x - mean
    node.keep_statistics(mean, var, inv_std, True, relu_workspace=workspace)
    return y,


def _add_residual(y, residual, relu):
    """``y <- relu(y + residual)`` (relu when asked) in place, in one pass
    on oneDNN's threads, where ``residual`` lies as ``y`` does (read as
    flat arrays); False when it did not run. oneDNN's relu turns NaN into
    0 where the body's ``maximum`` keeps it: ``y`` is finite here (its
    statistics, gamma and beta are), so a sum can only be NaN through the
    residual, which is checked first."""
    views = flat_views(y, residual)
    if views is None or (relu and not L.finite(residual)):
        return False
    dt = L.dt_of(y.dtype)
    add = cached(('add_relu' if relu else 'add', y.size, dt),
                 lambda: binary_add(y.size, Attr(relu=True) if relu else None,
                                    dt=dt))
    if add is None:
        return False
    add({L.ARG_SRC: views[0], L.ARG_SRC_1: views[1], L.ARG_DST: views[0]})
    return True


def _forward_plan(shape, eps, flags, prop=L.FORWARD_TRAINING,
                  dtype=numpy.float32):
    """The forward: the batch's statistics written to mean and variance,
    or (``L.USE_GLOBAL_STATS`` in ``flags``, ``L.FORWARD_INFERENCE``)
    read from them; x and y of ``dtype``."""
    pd = _forward_pd(shape, eps, flags, prop, L.dt_of(numpy.dtype(dtype)))
    args = (L.ARG_SRC, L.ARG_SCALE, L.ARG_SHIFT, L.ARG_MEAN, L.ARG_VARIANCE,
            L.ARG_DST) + ((L.ARG_WORKSPACE,) if flags & L.FUSE_NORM_RELU
                          else ())
    return Plan(L.Primitive(pd, args), {}, {L.ARG_DST: shape},
                channels_last=(L.ARG_DST,), dtype=dtype)


def batch_normalization_grad(node, inputs):
    x, gamma, gy = inputs[:3]
    if not _usable(node.lay, x, (gamma,), (gy,)):
        return None
    # With y (a forward that ended in relu): the relu mask that this
    # module's forward left (oneDNN's fuse_norm_relu backward), else gy
    # masked as the body masks it, by NumPy.
    fused = len(inputs) == 4 and node.relu_workspace is not None
    if len(inputs) == 4 and not fused:
        gy = node.masked(inputs)[2]
    flags = _SCALE_SHIFT | (L.FUSE_NORM_RELU if fused else 0)
    plan = cached(('bn_grad', x.shape, gy.strides, float(node.eps), flags,
                   x.dtype.str), lambda: _backward_plan(
                       x.shape, L.of(gy), node.eps, flags, x.dtype))
    if plan is None:
        return None
    node.retain_inputs(tuple(range(len(inputs))))
    # oneDNN takes the variance, the node keeps inv_std = (var + eps)^-1/2:
    # var = inv_std^-2 - eps gives back var + eps to float32 rounding.
    inv_std = node.inv_std.astype(numpy.float64)
    var = (1.0 / (inv_std * inv_std) - node.eps).astype(numpy.float32)
    mean = numpy.ascontiguousarray(node.mean, numpy.float32).reshape(-1)
    args = {L.ARG_SRC: x, L.ARG_MEAN: mean, L.ARG_VARIANCE: var,
            L.ARG_DIFF_DST: gy, L.ARG_SCALE: gamma}
    if fused:
        args[L.ARG_WORKSPACE] = node.relu_workspace
    out = plan(args)
    return out[L.ARG_DIFF_SRC], out[L.ARG_DIFF_SCALE], out[L.ARG_DIFF_SHIFT]


def _backward_plan(shape, gy_md, eps, flags, dtype):
    """gy in any layout (``gy_md``) is reordered to channels-last: a
    gradient is often an NCHW array from NumPy code (the loss's side of
    the network), or one of the sums of gradients. With
    ``L.FUSE_NORM_RELU`` in ``flags`` the primitive masks gy by the
    forward's workspace, which is laid out for the forward of the same
    shape, eps and flags (the hint)."""
    dt = L.dt_of(dtype)
    hint = _forward_pd(shape, eps, flags, dt=dt)
    md = L.channels_last(shape, dt)
    pd = L.PrimitiveDesc(
        'dnnl_batch_normalization_backward_primitive_desc_create', L.engine,
        L.BACKWARD, md, md, md, eps, flags, hint, None)
    args = (L.ARG_SRC, L.ARG_MEAN, L.ARG_VARIANCE, L.ARG_DIFF_DST,
            L.ARG_SCALE, L.ARG_DIFF_SRC, L.ARG_DIFF_SCALE, L.ARG_DIFF_SHIFT
            ) + ((L.ARG_WORKSPACE,) if flags & L.FUSE_NORM_RELU else ())
    c = shape[1]
    return Plan(L.Primitive(pd, args), {L.ARG_DIFF_DST: gy_md},
                {L.ARG_DIFF_SRC: shape, L.ARG_DIFF_SCALE: (c,),
                 L.ARG_DIFF_SHIFT: (c,)}, channels_last=(L.ARG_DIFF_SRC,),
                dtype={L.ARG_DIFF_SRC: dtype})


def fixed_batch_normalization(node, inputs):
    """Inference mode (``FixedBatchNormalization``): the given statistics
    (oneDNN's ``use_global_stats``), one pass over x where the body makes
    three."""
    x, gamma, beta, mean, var = inputs
    if not (_usable(node.lay, x, (gamma, beta, mean, var))
            and finite(gamma, beta, mean, var)):
        return None
    plan = cached(('fixed_bn', x.shape, float(node.eps)),
                  lambda: _forward_plan(x.shape, node.eps,
                                        L.USE_GLOBAL_STATS | _SCALE_SHIFT,
                                        L.FORWARD_INFERENCE))
    if plan is None:
        return None
    node.retain_inputs((0, 1, 3, 4))
    return plan({L.ARG_SRC: x, L.ARG_SCALE: gamma, L.ARG_SHIFT: beta,
                 L.ARG_MEAN: mean, L.ARG_VARIANCE: var})[L.ARG_DST],
