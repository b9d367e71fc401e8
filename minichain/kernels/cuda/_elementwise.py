"""CUDA kernels (CuPy ElementwiseKernels) for im2col/col2im and pooling.

Only imported on the GPU path; cupy itself comes from ``backend.get_cupy()``.
Every kernel computes one output element per thread from raw (C-contiguous)
inputs, so results equal the NumPy path's up to summation order.
Geometry ``g`` is ``_im2col.Geometry`` (kernel, stride, pad, dilation, input
and output sizes). Index arithmetic is 64-bit: a ResNet-50 col buffer at a
large batch passes 2**31 elements.
"""
from minichain import backend

_kernels = {}

_GEOM = ('int32 h, int32 w, int32 out_h, int32 out_w, int32 kh, int32 kw, '
         'int32 sy, int32 sx, int32 ph, int32 pw')

# Columns: (N, C, kh, kw, oh, ow) when batch_major, else (C, kh, kw, N, oh, ow).
_IM2COL = '''
    long long r = i;
    const int ox = r % out_w; r /= out_w;
    const int oy = r % out_h; r /= out_h;
    int kx, ky, c, b;  // (n and i are reserved by CuPy)
    if (batch_major) {
        kx = r % kw; r /= kw; ky = r % kh; r /= kh;
        c = r % channels; b = r / channels;
    } else {
        b = r % batch; r /= batch;
        kx = r % kw; r /= kw; ky = r % kh; c = r / kh;
    }
    const int y = oy * sy + ky * dy - ph;
    const int x = ox * sx + kx * dx - pw;
    if (0 <= y && y < h && 0 <= x && x < w) {
        col = img[((long long)(b * channels + c) * h + y) * w + x];
    } else {
        col = 0;
    }
'''

# Each pixel sums the column entries that read it.
_COL2IM = '''
    long long r = i;
    const int x = r % w; r /= w;
    const int y = r % h; r /= h;
    const int c = r % channels;
    const int b = r / channels;
    ACC_T val = 0;
    for (int ky = 0; ky < kh; ++ky) {
        int oy = y + ph - ky * dy;
        if (oy < 0 || oy % sy != 0) continue;
        oy /= sy;
        if (oy >= out_h) continue;
        for (int kx = 0; kx < kw; ++kx) {
            int ox = x + pw - kx * dx;
            if (ox < 0 || ox % sx != 0) continue;
            ox /= sx;
            if (ox >= out_w) continue;
            long long k;
            if (batch_major) {
                k = (((long long)(b * channels + c) * kh + ky) * kw + kx);
            } else {
                k = (((long long)c * kh + ky) * kw + kx) * batch + b;
            }
            val += col[(k * out_h + oy) * out_w + ox];
        }
    }
    img = val;
'''

_POOL_PRELUDE = '''
    long long r = i;
    const int ox = r % out_w; r /= out_w;
    const int oy = r % out_h;
    const long long plane = r / out_h;  // n * C + c
    const int y0 = oy * sy - ph, x0 = ox * sx - pw;
    const T* src = &in[plane * h * w];
'''

# The max over the window's in-bounds pixels (padding counts as -inf), and
# its window-local index ky*kw + kx; the first maximum wins, as in NumPy,
# and NaN wins over any number (the first NaN; `v > best` alone drops it).
_MAX_FWD = _POOL_PRELUDE + '''
    T best = neg_inf;
    int arg = 0;
    for (int ky = 0; ky < kh; ++ky) {
        const int y = y0 + ky;
        if (y < 0 || y >= h) continue;
        for (int kx = 0; kx < kw; ++kx) {
            const int x = x0 + kx;
            if (x < 0 || x >= w) continue;
            const T v = src[y * w + x];
            if (v > best || (v != v && best == best)) {
                best = v;
                arg = ky * kw + kx;
            }
        }
    }
    out = best;
    indexes = arg;
'''

_AVG_FWD = _POOL_PRELUDE + '''
    ACC_T val = 0;
    for (int ky = 0; ky < kh; ++ky) {
        const int y = y0 + ky;
        if (y < 0 || y >= h) continue;
        for (int kx = 0; kx < kw; ++kx) {
            const int x = x0 + kx;
            if (x < 0 || x >= w) continue;
            val += src[y * w + x];
        }
    }
    out = val * (ACC_T)coeff;
'''

# Each input pixel collects gy from the windows that contain it (and, for
# max pooling, chose it).
_POOL_BWD = '''
    long long r = i;
    const int x = r % w; r /= w;
    const int y = r % h;
    const long long plane = r / h;
    ACC_T val = 0;
    for (int ky = 0; ky < kh; ++ky) {
        int oy = y + ph - ky;
        if (oy < 0 || oy % sy != 0) continue;
        oy /= sy;
        if (oy >= out_h) continue;
        for (int kx = 0; kx < kw; ++kx) {
            int ox = x + pw - kx;
            if (ox < 0 || ox % sx != 0) continue;
            ox /= sx;
            if (ox >= out_w) continue;
            const long long o = (plane * out_h + oy) * out_w + ox;
            if (MATCH) val += gy[o];
        }
    }
    gx = val * (ACC_T)coeff;
'''

# ggy[o] = ggx at the pixel that window o chose (0 if that was padding).
_MAX_GATHER = _POOL_PRELUDE + '''
    const int k = indexes;
    const int y = y0 + k / kw, x = x0 + k % kw;
    out = (0 <= y && y < h && 0 <= x && x < w) ? src[y * w + x] : (T)0;
'''


# The type that sums accumulate in: float for float16 data (a float16 sum
# stops growing by 1 past 2048 and is inf past 65504), T otherwise. The
# float16 case only where CuPy's float16 exists (the CPU emulation of the
# tests has no float16).
_PREAMBLE = '''
template <typename U> struct minichain_acc { typedef U type; };
#ifdef __CUDACC__
template <> struct minichain_acc<float16> { typedef float type; };
#endif
#define ACC_T minichain_acc<T>::type
'''

_CONV = ', int32 dy, int32 dx, int32 channels, int32 batch, bool batch_major'
# name: (in_params, out_params, operation) of each ElementwiseKernel.
SPECS = {
    'im2col': ('raw T img, ' + _GEOM + _CONV, 'T col', _IM2COL),
    'col2im': ('raw T col, ' + _GEOM + _CONV, 'T img', _COL2IM),
    'max_fwd': ('raw T in, ' + _GEOM + ', T neg_inf',
                'T out, int32 indexes', _MAX_FWD),
    'avg_fwd': ('raw T in, ' + _GEOM + ', T coeff', 'T out', _AVG_FWD),
    'max_bwd': ('raw T gy, raw int32 indexes, ' + _GEOM + ', T coeff', 'T gx',
                _POOL_BWD.replace('MATCH', 'indexes[o] == ky * kw + kx')),
    'avg_bwd': ('raw T gy, ' + _GEOM + ', T coeff', 'T gx',
                _POOL_BWD.replace('MATCH', 'true')),
    'max_gather': ('raw T in, int32 indexes, ' + _GEOM, 'T out', _MAX_GATHER),
}


def make_kernel(cupy, name):
    """The ``cupy.ElementwiseKernel`` of ``SPECS[name]`` (CuPy compiles it at
    its first call, per dtype). Also called by ``tests/cuda`` to compile
    every kernel without a GPU."""
    in_params, out_params, operation = SPECS[name]
    return cupy.ElementwiseKernel(in_params, out_params, operation,
                                  'minichain_' + name, preamble=_PREAMBLE)


def _kernel(name):
    """The kernel object (built once per process, on first use)."""
    if name not in _kernels:
        _kernels[name] = make_kernel(backend.get_cupy(), name)
    return _kernels[name]


def _geom_args(g):
    return (g.h, g.w, g.oh, g.ow, g.kh, g.kw, g.sy, g.sx, g.ph, g.pw)


def im2col(x, g, batch_major):
    """Columns of x (N, C, h, w) in either layout (see module docstring)."""
    cp = backend.get_cupy()
    x = cp.ascontiguousarray(x)
    n, c = x.shape[:2]
    shape = ((n, c, g.kh, g.kw, g.oh, g.ow) if batch_major
             else (c, g.kh, g.kw, n, g.oh, g.ow))
    col = cp.empty(shape, x.dtype)
    _kernel('im2col')(x, *_geom_args(g), g.dy, g.dx, c, n, batch_major, col)
    return col


def col2im(col, g, batch_major):
    """Sum columns (either layout) into images (N, C, h, w)."""
    cp = backend.get_cupy()
    col = cp.ascontiguousarray(col)
    if batch_major:
        n, c = col.shape[:2]
    else:
        c, n = col.shape[0], col.shape[3]
    out = cp.empty((n, c, g.h, g.w), col.dtype)
    _kernel('col2im')(col, *_geom_args(g), g.dy, g.dx, c, n, batch_major,
                      out)
    return out


def max_pool_forward(x, g):
    """(y, indexes): window maxima and their window-local int32 indexes."""
    cp = backend.get_cupy()
    x = cp.ascontiguousarray(x)
    shape = x.shape[:2] + (g.oh, g.ow)
    y = cp.empty(shape, x.dtype)
    idx = cp.empty(shape, cp.int32)
    _kernel('max_fwd')(x, *_geom_args(g), x.dtype.type(float('-inf')), y, idx)
    return y, idx


def _pool(name, a, g, size, *scalars, indexes=None):
    """Pooling kernel ``name`` on ``a`` (N, C, ...) and the windows'
    choices ``indexes`` when given, the geometry and ``scalars``, into a
    new array of ``a``'s dtype, (N, C) + ``size``."""
    cp = backend.get_cupy()
    ins = [cp.ascontiguousarray(a)]
    if indexes is not None:
        ins.append(cp.ascontiguousarray(indexes))
    out = cp.empty(a.shape[:2] + size, a.dtype)
    _kernel(name)(*ins, *_geom_args(g), *scalars, out)
    return out


def max_pool_backward(gy, indexes, g):
    """gx (N, C, h, w): each gy routed to the pixel its window chose."""
    return _pool('max_bwd', gy, g, (g.h, g.w), gy.dtype.type(1),
                 indexes=indexes)


def max_pool_gather(ggx, indexes, g):
    """ggy (N, C, oh, ow): ggx read at each window's chosen pixel."""
    return _pool('max_gather', ggx, g, (g.oh, g.ow), indexes=indexes)


def avg_pool_forward(x, g):
    """Window sums divided by the full window size kh*kw."""
    return _pool('avg_fwd', x, g, (g.oh, g.ow),
                 x.dtype.type(1.0 / (g.kh * g.kw)))


def avg_pool_backward(gy, g):
    """gx (N, C, h, w): gy / (kh*kw) spread over each window."""
    return _pool('avg_bwd', gy, g, (g.h, g.w),
                 gy.dtype.type(1.0 / (g.kh * g.kw)))
