"""Every CUDA kernel minichain defines, with the arguments its calls pass.

Each entry describes a launch as CuPy sees it after its own preprocessing:
raw arrays keep their dimensions, the other arrays are reduced to the
fewest dimensions their strides allow (C-contiguous outputs become 1-D),
Python scalars take the dtype of their parameter. ``T`` runs over every
dtype the code can pass: the functions accept float16, float32 and float64
(``_check.check_float``), pooling indexes are int32, and batch
normalization keeps its statistics in float32 for float16 and float32 and
in float64 for float64 (``kernels/cuda/normalization.py``, ``acc_dtype``).
"""
import numpy

from minichain.kernels.cuda import _elementwise as _cuda_kernels
from minichain.kernels.cuda import normalization as _normalization_kernels
from minichain.kernels.cuda import optimizers as _optimizer_kernels
from tests.cuda.offline import array, scalar

FLOATS = ('float16', 'float32', 'float64')
INT32 = numpy.int32
_GEOM = [scalar(INT32)] * 10  # h, w, out_h, out_w, kh, kw, sy, sx, ph, pw
_CONV = [scalar(INT32)] * 4 + [scalar(numpy.bool_)]  # dy dx channels batch bm


def _im2col_args(t):
    """name -> argument list of ``_cuda_kernels``' calls, for dtype t."""
    return {
        'im2col': [array(t, 4)] + _GEOM + _CONV + [array(t)],
        'col2im': [array(t, 6)] + _GEOM + _CONV + [array(t)],
        'max_fwd': [array(t, 4)] + _GEOM + [scalar(t), array(t),
                                            array(INT32)],
        'avg_fwd': [array(t, 4)] + _GEOM + [scalar(t), array(t)],
        'max_bwd': ([array(t, 4), array(INT32, 4)] + _GEOM
                    + [scalar(t), array(t)]),
        'avg_bwd': [array(t, 4)] + _GEOM + [scalar(t), array(t)],
        'max_gather': [array(t, 4), array(INT32)] + _GEOM + [array(t)],
    }


def _bn_args(t, acc, layout):
    """name -> (kind, arguments, extra) of ``_normalization_kernels``'
    calls for an input of dtype t, statistics of dtype acc. Over an (N, C)
    input ('nc') the arrays keep 2 dimensions (the channel arrays broadcast
    with stride 0 along N), but x alone merges to 1 (the reduced axis
    comes first); over NCHW ('nchw') H and W merge: 3 dimensions, and x is
    no longer C-contiguous once CuPy moves the channel axis last for a
    reduction."""
    nd = {'nc': 2, 'nchw': 3}[layout]

    def a(dtype, contig=False, ndim=nd):
        return array(dtype, ndim, contig)
    flat = layout == 'nc'  # reductions: x C-contiguous
    red = dict(in_ndim=nd, out_ndim=1)
    relu = scalar(numpy.bool_)
    return {
        'fwd': ('elementwise', [a(t, True)] + [a(acc)] * 3
                + [relu, a(t, True)], {}),
        'fwd_add': ('elementwise', [a(t, True)] + [a(acc)] * 3
                    + [a(t, True), relu, a(t, True)], {}),
        'bwd': ('elementwise', [a(t, True), a(t, True)] + [a(acc)] * 4
                + [a(t, True)], {}),
        'sum': ('reduction', [a(t, flat, 1 if flat else nd), array(acc)],
                dict(in_ndim=1 if flat else nd, out_ndim=1)),
        'sq_dev': ('reduction', [a(t, flat), a(acc), scalar(acc),
                                 array(acc)], red),
        'dot_dev': ('reduction', [a(t, flat), a(t, flat), a(acc),
                                  array(acc)], red),
    }


def _bn_channel_args(t, acc):
    """name -> arguments of the per-channel kernels (1-D arrays; gamma's
    dtype and the running statistics' are t)."""
    return {
        'stats': [array(t)] * 2 + [array(acc)] * 2 + [scalar(acc)] * 5
        + [array(acc)] * 5 + [array(t)] * 2,
        'bwd_stats': [array(t)] + [array(acc)] * 3 + [scalar(acc)]
        + [array(t)] * 2 + [array(acc)] * 3,
    }


def launches():
    """Yield ``(label, kind, kernel, args, extra)`` for every launch shape;
    ``kind`` is 'elementwise', 'reduction' or 'cub', ``extra`` the keyword
    arguments of the ``offline`` function of that kind."""
    import cupy
    for name in sorted(_cuda_kernels.SPECS):
        kernel = _cuda_kernels.make_kernel(cupy, name)
        for t in FLOATS:
            yield ('{}[{}]'.format(name, t), 'elementwise', kernel,
                   _im2col_args(t)[name], {})
    for t in FLOATS:
        acc = _normalization_kernels.acc_dtype(numpy.dtype(t)).name
        k = _normalization_kernels.make_kernels(cupy, acc)
        for layout in ('nc', 'nchw'):
            for name, (kind, args, extra) in sorted(
                    _bn_args(t, acc, layout).items()):
                yield ('bn_{}[{},{}]'.format(name, t, layout), kind, k[name],
                       args, extra)
        for name, args in sorted(_bn_channel_args(t, acc).items()):
            yield ('bn_{}[{}]'.format(name, t), 'elementwise', k[name],
                   args, {})
        # CuPy sums through CUB when the reduced axes are the contiguous
        # ones (e.g. axis=1 of a C-ordered (C, M) input, M >= 128)
        yield ('bn_sum[{},cub]'.format(t), 'cub', k['sum'],
               [array(t, 2), array(acc)], {})
    sgd = _optimizer_kernels.make_kernel(cupy)  # g, lr, mu, wd, decay, p, v
    for t in FLOATS:
        yield ('momentum_sgd[{}]'.format(t), 'elementwise', sgd,
               [array(t)] + [scalar(t)] * 3 + [scalar(numpy.bool_)]
               + [array(t)] * 2, {})
    sgd_all = _optimizer_kernels.make_kernel_all(cupy)  # hp, n, table
    for t in FLOATS:
        yield ('momentum_sgd_all[{}]'.format(t), 'elementwise', sgd_all,
               [array(t), scalar(INT32), array(numpy.int64)], {})
