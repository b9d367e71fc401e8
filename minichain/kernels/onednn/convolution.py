"""oneDNN kernels of the three convolution nodes (functions/convolution.py).

``Convolution2D`` is oneDNN's convolution forward; ``Deconvolution2D``
(what a convolution's backward uses for gx) is its backward data, and
``Convolution2DGradW`` its backward weights. They take their inputs in
any layout and return y and gx channels-last (NHWC memory, ``_plan.py``
says why); the primitive itself runs on NHWC or, for 3x3 and 7x7 on
small maps, in oneDNN's blocked layout with reorders in and out
(``_on_nhwc``).

Weights are reordered into oneDNN's layout on every call: a cache of the
reordered copy, valid until the next parameter update, is written
(``_plan.CACHE_WEIGHTS``) but off, since forward and backward data want
two different layouts and each is made once per update anyway (_plan.py
says more). The weight reorders were about 7% of oneDNN's time in a step
at 32 x 28 (ONEDNN_VERBOSE=1).

Under ``config.fp32_math`` 'bf16' a 1x1 convolution to small maps is one
matrix product of the channels-last arrays instead (``_products.py``),
which each kernel tries first.

bfloat16 arrays (``ml_dtypes``: mixed16's activations on the CPU, where
``links/_mixed16.py`` casts x and W) are read and written in bfloat16
whatever ``config.fp32_math`` says, with float32 sums inside oneDNN, at
every size: the body on bfloat16 has no BLAS.

Declined (the next kernel or the body runs): dtypes other than float32
and bfloat16 (or two of them mixed), groups > 1, sizes where the body
measured faster (``_usable``), any geometry oneDNN has no optimized code
for, and, where windows reach into the padding, weights (forward) or a
gy (backward weights) that are not all finite: the body multiplies the
padding's zeros by them (0 * inf is NaN) where oneDNN skips the padding.
"""
import numpy

from minichain.functions.geometry import conv_outsize
from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn import _fpmath, _products
from minichain.kernels.onednn._plan import Plan, cached


def _geometry(in_size, out_size, k, stride, pad, dilate):
    """oneDNN's (strides, dilates, padding_l, padding_r) for a convolution
    from in_size to out_size. oneDNN counts dilation from 0 (1 in Chainer
    is 0 there) and wants the right padding that makes the sizes agree,
    which cover_all makes larger than the left one and a stride that skips
    the last pixels makes negative."""
    dil = tuple(d - 1 for d in dilate)
    pad_r = tuple((out_size[a] - 1) * stride[a] + (k[a] - 1) * dilate[a] + 1
                  - in_size[a] - pad[a] for a in (0, 1))
    return tuple(stride), dil, tuple(pad), pad_r


# Where the body measured faster than oneDNN (fwd + bwd data + bwd
# weights at batch 32, 2 threads; bench/README.md, "oneDNN kernels"), the
# kernels decline: output maps under 3x3 pixels (ResNet-50's last stage on
# small images: too little work per call for oneDNN's blocking; run on
# oneDNN, the step at 32 x 28 small2 measured 1.01x, 0.96-1.38). A grey
# or RGB stem was declined too while the kernels returned NCHW; with
# channels-last outputs (the batch normalization and max pooling after it
# then run on oneDNN too) taking it made the step at 8 x 224 1.13x faster
# (0.94-1.42) and left 32 x 28 small2 as it was (1.01x).
# Under 'bf16' the forward and the backward data take the small maps too,
# but for a strided 1x1: NumPy kernel time / oneDNN bf16 time at batch 32
# on 2x2 outputs, fwd and bwd data, 1.5-2.7x for the 3x3 (stride 1 and 2),
# 1.1-1.6x for the 1x1, 0.9x for the strided 1x1 (1024 -> 2048); the
# weight gradient gained nothing there (0.9-1.0x; 2 threads, AMD EPYC Zen
# 4, 2026-12-04).
_MIN_PIXELS = 9
# Which layout the primitive itself runs on (its inputs are reordered
# into it and its outputs out of it where they differ): NHWC, the layout
# the kernels return (_plan.py), for 1x1 convolutions and on maps of at
# least this many output pixels; else oneDNN's blocked layout ('any').
# fwd + bwd data + bwd weights of a 3x3 at batch 32, NHWC / blocked in
# ms: 8.6 / 14.3 at 14x14, 8.9 / 8.3 at 7x7, 13.8 / 11.4 at 4x4, 35.0 /
# 22.3 at 2x2 (bench/onednn_layers.py, bench/README.md); the NHWC code
# (brgconv) also took 1x1 convolutions 1.05-1.16x faster than blocked
# with reorders.
_NHWC_MIN_PIXELS = 100


def _on_nhwc(k, y_shape):
    """Whether a convolution with kernel ``k`` and output ``y_shape`` runs
    on NHWC (else in oneDNN's blocked layout)."""
    return (tuple(k) == (1, 1)
            or y_shape[2] * y_shape[3] >= _NHWC_MIN_PIXELS)


def _mds(nhwc, x_shape, w_shape, y_shape, dts=(L.F32,) * 3):
    """The primitive's mds of (input, weights, output), of data types
    ``dts``: the activations on NHWC when ``nhwc``, else oneDNN's choice
    (``format_tag_any``: the blocked layout of its direct 3x3 and 7x7
    kernels); weights always its choice (reordered from OIHW by the
    plan)."""
    act = L.channels_last if nhwc else L.any_layout
    return (act(x_shape, dts[0]), L.any_layout(w_shape, dts[1]),
            act(y_shape, dts[2]))


def _dts(math, out, out_dt=L.F32):
    """Data types of (input, weights, output) under ``math``: the two
    factors in bfloat16 under 'bf16' (``_fpmath.py``), position ``out``
    (what the primitive writes) in ``out_dt``."""
    low = _fpmath.dt(math)
    return tuple(out_dt if i == out else low for i in range(3))


def _math(a):
    """(math, the data type written) of a convolution of arrays like
    ``a``: bfloat16 arrays in bfloat16; float32 ones read as
    ``config.fp32_math`` says and written in float32."""
    if a.dtype == numpy.float32:
        return _fpmath.mode(), L.F32
    return 'bf16', L.BF16


def _usable(node, y_shape, *arrays, small_in_bf16=False):
    """4-D arrays of one dtype oneDNN reads, one group, and a size where
    oneDNN pays, for a convolution to an output of ``y_shape`` (any size
    for bfloat16 arrays, and under 'bf16' where ``small_in_bf16``)."""
    low = arrays[0].dtype != numpy.float32
    return (node.groups == 1 and L.dt_of(arrays[0].dtype) is not None
            and all(a.dtype == arrays[0].dtype and a.ndim == 4
                    for a in arrays)
            and (y_shape[2] * y_shape[3] >= _MIN_PIXELS or low
                 or small_in_bf16 and _fpmath.mode() == 'bf16'))


def _small_in_bf16(k, stride):
    """Whether bfloat16 pays on maps under _MIN_PIXELS (not a strided
    1x1)."""
    return tuple(k) != (1, 1) or tuple(stride) == (1, 1)


def _padded(geo):
    """Whether some window reaches into the padding."""
    return max(geo[2] + geo[3]) > 0


def _forward_pd(src, w, dst, geo, bias_md=None):
    return L.PrimitiveDesc(
        'dnnl_convolution_forward_primitive_desc_create', L.engine,
        L.FORWARD_TRAINING, L.CONVOLUTION_DIRECT, src, w, bias_md, dst,
        *map(L.dims, geo), None)


# -- Convolution2D: forward -----------------------------------------------------
def convolution_2d(node, inputs):
    x, W = inputs[:2]
    b = inputs[2] if len(inputs) == 3 else None
    k = W.shape[2:]
    out = tuple(conv_outsize(x.shape[2 + a], k[a], node.stride[a],
                             node.pad[a], node.cover_all, node.dilate[a])
                for a in (0, 1))
    y_shape = (x.shape[0], W.shape[0]) + out
    product = _products.forward(node, x, W, b, out)
    if product is not None:
        return product,
    if (not _usable(node, y_shape, x, W,
                    small_in_bf16=_small_in_bf16(k, node.stride))
            or (b is not None and (b.dtype != x.dtype
                                   or b.shape != (W.shape[0],)))):
        return None
    geo = _geometry(x.shape[2:], out, k, node.stride, node.pad, node.dilate)
    if _padded(geo) and not L.finite(W):
        return None
    math, out_dt = _math(x)
    key = ('conv', x.shape, x.strides, W.shape, W.strides, b is not None,
           geo, math, out_dt)
    plan = cached(key, lambda: _forward_plan(x, W, b, y_shape, geo, math,
                                             out_dt))
    if plan is None:
        return None
    node.retain_inputs((0, 1))
    args = {L.ARG_SRC: x, L.ARG_WEIGHTS: W}
    if b is not None:
        # oneDNN reads the bias as one dense vector whatever its md says:
        # a view (P[::2], reversed, broadcast) is copied (O floats).
        args[L.ARG_BIAS] = numpy.ascontiguousarray(b)
    return plan(args)[L.ARG_DST],


def _forward_plan(x, W, b, y_shape, geo, math, out_dt):
    user = {L.ARG_SRC: L.of(x), L.ARG_WEIGHTS: L.of(W)}
    if None in user.values():
        return None
    bias_md = None if b is None else L.plain(b.shape, dt=out_dt)
    mds = _mds(_on_nhwc(W.shape[2:], y_shape), x.shape, W.shape, y_shape,
               _dts(math, 2, out_dt))
    pd = _forward_pd(*mds, geo, bias_md)
    args = (L.ARG_SRC, L.ARG_WEIGHTS, L.ARG_DST) + (
        () if b is None else (L.ARG_BIAS,))
    return Plan(L.Primitive(pd, args), user, {L.ARG_DST: y_shape},
                weights=L.ARG_WEIGHTS, channels_last=(L.ARG_DST,),
                dtype=x.dtype)


# -- Deconvolution2D: the convolution's backward data ---------------------------
def deconvolution_2d(node, inputs):
    gy, W = inputs[:2]
    b = inputs[2] if len(inputs) == 3 else None
    k = W.shape[2:]
    gx_shape = (gy.shape[0], W.shape[1]) + tuple(node.outsize)
    product = _products.backward_data(node, gy, W, b)
    if product is not None:
        return product,
    # Sized as the convolution whose backward this is: gx -> gy.
    if (not _usable(node, gy.shape, gy, W,
                    small_in_bf16=_small_in_bf16(k, node.stride))
            or (b is not None and b.dtype != gy.dtype)):
        return None
    geo = _geometry(node.outsize, gy.shape[2:], k, node.stride, node.pad,
                    node.dilate)
    math, out_dt = _math(gy)
    key = ('deconv', gy.shape, gy.strides, W.shape, W.strides, gx_shape, geo,
           math, out_dt)
    plan = cached(key, lambda: _backward_data_plan(gy, W, gx_shape, geo,
                                                   math, out_dt))
    if plan is None:
        return None
    node.retain_inputs((0, 1))
    gx = plan({L.ARG_DIFF_DST: gy, L.ARG_WEIGHTS: W})[L.ARG_DIFF_SRC]
    if b is not None:
        gx += b.reshape(1, -1, 1, 1)
    return gx,


def _backward_data_plan(gy, W, gx_shape, geo, math, out_dt):
    user = {L.ARG_DIFF_DST: L.of(gy), L.ARG_WEIGHTS: L.of(W)}
    if None in user.values():
        return None
    nhwc = _on_nhwc(W.shape[2:], gy.shape)
    diff_src, w, diff_dst = _mds(nhwc, gx_shape, W.shape, gy.shape,
                                 _dts(math, 0, out_dt))
    hint = _forward_pd(*_mds(nhwc, gx_shape, W.shape, gy.shape,
                             _dts(math, 2, out_dt)), geo)
    pd = L.PrimitiveDesc(
        'dnnl_convolution_backward_data_primitive_desc_create', L.engine,
        L.CONVOLUTION_DIRECT, diff_src, w, diff_dst, *map(L.dims, geo), hint,
        None)
    primitive = L.Primitive(pd, (L.ARG_DIFF_DST, L.ARG_WEIGHTS,
                                 L.ARG_DIFF_SRC))
    return Plan(primitive, user, {L.ARG_DIFF_SRC: gx_shape},
                weights=L.ARG_WEIGHTS, channels_last=(L.ARG_DIFF_SRC,),
                dtype=gy.dtype)


# -- Convolution2DGradW: the convolution's backward weights ---------------------
# Under 'bf16' the weight gradient reads x and gy as bfloat16 and writes
# float32, as the forward and the backward data do, except for an input
# of fewer channels than this (an RGB or grey stem), where oneDNN's
# bfloat16 code took 1.6-2.2x float32's time. Elsewhere float32 time /
# bf16 time (x and gy float32 channels-last, reordered by the plan; 2
# threads, AMD EPYC Zen 4, 2026-12-04) was 1.2-2.0x for the 3x3 at 14x14,
# 7x7 and 4x4, 1.0-1.6x for the 1x1 (strided ones too), and 1.3-1.4x over
# a small2 step's weight gradients (one process alternating the two). A
# loaded run had measured 0.50x, and kept them float32 for a while.
_BF16_GRAD_W_MIN_CHANNELS = 16


def convolution_2d_grad_w(node, inputs):
    x, gy = inputs
    product = _products.grad_w(node, x, gy)
    if product is not None:
        return product,
    if not _usable(node, gy.shape, x, gy) or _broken_1x1(node, x):
        return None
    w_shape = node.w_shape
    geo = _geometry(x.shape[2:], gy.shape[2:], w_shape[2:], node.stride,
                    node.pad, node.dilate)
    if _padded(geo) and not L.finite(gy):
        return None
    # (a stem's bfloat16 arrays are reordered to float32 by the plan)
    math = (_math(x)[0] if x.shape[1] >= _BF16_GRAD_W_MIN_CHANNELS
            else 'strict')
    key = ('grad_w', x.shape, x.strides, gy.shape, gy.strides, w_shape, geo,
           math, x.dtype.str)
    plan = cached(key, lambda: _backward_weights_plan(x, gy, w_shape, geo,
                                                      math))
    if plan is None:
        return None
    node.retain_inputs((0, 1))
    return plan({L.ARG_SRC: x, L.ARG_DIFF_DST: gy})[L.ARG_DIFF_WEIGHTS],


def _broken_1x1(node, x):
    """oneDNN 3.2's backward weights of a strided 1x1 window over fewer
    than 16 input channels (its jit_1x1 code) corrupts the heap or returns
    wrong values (errors of 20 on values of 1) when the batch is smaller
    than its thread count: at 2 threads batch 1, at 4 batch 1-3, at 8
    batch 4 (channels 2, 4, 8, 13; not 16-64, not stride 1, not 3x3; AMD
    EPYC Zen 4, 2026-12-04). Declined whatever the batch: the body runs."""
    return (tuple(node.w_shape[2:]) == (1, 1) and tuple(node.stride) != (1, 1)
            and x.shape[1] < 16)


def _backward_weights_plan(x, gy, w_shape, geo, math):
    user = {L.ARG_SRC: L.of(x), L.ARG_DIFF_DST: L.of(gy)}
    if None in user.values():
        return None
    nhwc = _on_nhwc(w_shape[2:], gy.shape)
    # oneDNN sums the weight gradient in float32 whatever it writes
    src, diff_w, diff_dst = _mds(nhwc, x.shape, w_shape, gy.shape,
                                 _dts(math, 1))
    hint = _forward_pd(*_mds(nhwc, x.shape, w_shape, gy.shape,
                             _dts(math, 2)), geo)
    pd = L.PrimitiveDesc(
        'dnnl_convolution_backward_weights_primitive_desc_create', L.engine,
        L.CONVOLUTION_DIRECT, src, diff_w, None, diff_dst, *map(L.dims, geo),
        hint, None)
    primitive = L.Primitive(pd, (L.ARG_SRC, L.ARG_DIFF_DST,
                                 L.ARG_DIFF_WEIGHTS))
    return Plan(primitive, user, {L.ARG_DIFF_WEIGHTS: tuple(w_shape)},
                dtype=x.dtype)
