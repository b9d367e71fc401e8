"""convolution_2d, deconvolution_2d, im2col: forward against naive loops,
gradients (first and second order), fused versus composite, errors, GPU."""
import numpy
import pytest

from minichain import Variable, backend, host
import minichain.functions as F
from minichain.kernels.numpy import (_batch_last, _im2col, _parallel,
                                     _strided_pointwise)
from minichain.functions.convolution import _convolution_2d_composite
from minichain.gradient_check import check_backward, check_double_backward
from tests.functions.cuda_emulation import emulated_cuda  # noqa: F401

# (ksize, stride, pad, dilate, groups, cover_all)
CASES = [
    ((3, 3), (1, 1), (1, 1), (1, 1), 1, False),
    ((3, 2), (2, 1), (1, 2), (1, 1), 1, False),
    ((3, 3), (2, 2), (1, 1), (2, 1), 1, True),
    ((2, 2), (3, 3), (2, 2), (1, 1), 1, True),
    ((3, 3), (1, 1), (1, 1), (1, 1), 2, False),
    ((1, 1), (1, 1), (0, 0), (1, 1), 1, False),
    ((1, 1), (2, 2), (0, 0), (1, 1), 2, False),
    ((5, 5), (1, 1), (0, 0), (1, 1), 1, False),  # kernel == input width
]
IDS = ['k{}s{}p{}d{}g{}{}'.format(k[0], s[0], p[0], d[0], g, 'c' if c else '')
       for k, s, p, d, g, c in CASES]


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_backward_float64_batch_last(case, monkeypatch):
    """The images-last columns (``_batch_last.py``) in every chunk."""
    monkeypatch.setattr(_im2col, '_BATCH_LAST_MIN_IMAGES', 1)
    x, W, b = _inputs(case, n=3)
    f = _conv(case)
    gy = numpy.random.default_rng(2).standard_normal(f(x, W, b).shape)
    check_backward(f, (x, W, b), gy, eps=1e-6, atol=1e-7, rtol=1e-6)


def test_small_maps_of_a_batch_take_batch_last(monkeypatch):
    calls = []
    real = _batch_last.columns
    monkeypatch.setattr(_batch_last, 'columns',
                        lambda *a: calls.append(a[2:4]) or real(*a))
    case = CASES[0]
    x, W, b = _inputs(case, n=2 * _im2col._BATCH_LAST_MIN_IMAGES, h=4, w=4)
    y = _conv(case)(x, W, b)  # one chunk, or one per thread of two
    assert sum(n1 - n0 for n0, n1 in calls) == x.shape[0]
    numpy.testing.assert_allclose(
        y.array, naive_conv(x, W, b, *case), rtol=1e-12, atol=1e-12)
    calls.clear()
    _conv(case)(x[:_im2col._BATCH_LAST_MIN_IMAGES - 1], W, b)  # too few
    assert calls == []


def _sizes(h, w, k, s, p, d, cover_all):
    return tuple(_im2col.conv_outsize(n, k[a], s[a], p[a], cover_all, d[a])
                 for a, n in enumerate((h, w)))


def naive_conv(x, W, b, k, s, p, d, groups, cover_all):
    """Direct loops over every output element (the reference)."""
    n, c, h, w = x.shape
    o, cg = W.shape[:2]
    oh, ow = _sizes(h, w, k, s, p, d, cover_all)
    og = o // groups
    y = numpy.zeros((n, o, oh, ow))
    for oc in range(o):
        c0 = (oc // og) * cg
        for i in range(oh):
            for j in range(ow):
                for ky in range(k[0]):
                    for kx in range(k[1]):
                        r = i * s[0] + ky * d[0] - p[0]
                        q = j * s[1] + kx * d[1] - p[1]
                        if 0 <= r < h and 0 <= q < w:
                            y[:, oc, i, j] += x[:, c0:c0 + cg, r, q] @ \
                                W[oc, :, ky, kx]
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def naive_deconv(x, W, b, k, s, p, d, groups, out):
    """Scatter each input pixel times the kernel (the reference)."""
    n, ci, h, w = x.shape
    cog = W.shape[1]
    cig = ci // groups
    y = numpy.zeros((n, cog * groups) + tuple(out))
    for c in range(ci):
        g = c // cig
        for i in range(h):
            for j in range(w):
                for ky in range(k[0]):
                    for kx in range(k[1]):
                        r = i * s[0] + ky * d[0] - p[0]
                        q = j * s[1] + kx * d[1] - p[1]
                        if 0 <= r < out[0] and 0 <= q < out[1]:
                            y[:, g * cog:(g + 1) * cog, r, q] += \
                                x[:, c, i, j][:, None] * W[c, :, ky, kx]
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def _inputs(case, dtype=numpy.float64, n=2, c=4, h=5, w=5, seed=0):
    k, s, p, d, g, cover_all = case
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(dtype)
    W = rng.standard_normal((6, c // g) + k).astype(dtype)
    b = rng.standard_normal(6).astype(dtype)
    return x, W, b


def _conv(case):
    k, s, p, d, g, cover_all = case
    return lambda x, W, b=None: F.convolution_2d(x, W, b, s, p, cover_all, d,
                                                 g)


@pytest.fixture(params=[None, (1, 1 << 30, None), (2, 1 << 30, None),
                        (3, 1, None), (2, 1 << 30, 0), (1, 1, None, 1),
                        (1, 1, 0, 4000), (1, 1 << 30, None, 2 << 20, 1),
                        (2, 1 << 30, 0, 2 << 20, 1)],
                ids=['default', 'chunk1', 'chunk2', 'tinybuf', 'gw-flipped',
                     'row-bands', 'bands-flipped', 'batch-last',
                     'batch-last-flipped'])
def chunking(request, monkeypatch):
    """Force the CPU GEMM path through one, several and uneven chunks,
    single images cut into bands of output rows (one row each, or a few),
    and conv_grad_w through its transposed accumulation (gW^T); the
    images-last columns (_batch_last.py) for chunks of any size."""
    if request.param is not None:
        columns, nbytes, flip_min = request.param[:3]
        monkeypatch.setattr(_im2col, '_MIN_COLUMNS', columns)
        monkeypatch.setattr(_im2col, '_MIN_COLUMNS_THREADED', columns)
        monkeypatch.setattr(_im2col, '_CHUNK_BYTES', nbytes)
        if flip_min is not None:
            monkeypatch.setattr(_im2col, '_FLIP_MIN_COLUMNS', flip_min)
        if len(request.param) > 3:
            monkeypatch.setattr(_im2col, '_BAND_BYTES', request.param[3])
        if len(request.param) > 4:
            monkeypatch.setattr(_im2col, '_BATCH_LAST_MIN_IMAGES',
                                request.param[4])


@pytest.fixture(params=[1, 3], ids=['1thread', '3threads'])
def threads(request, monkeypatch):
    """Run the ops on this many threads of their own (the BLAS count that
    cpu_kernel_scope finds on entry), cutting even tiny products by rows."""
    before = host.get_blas_threads()
    if before is None:
        pytest.skip('no OpenBLAS/MKL found: the thread count is not settable')
    host.set_blas_threads(request.param)
    monkeypatch.setattr(_parallel, '_MIN_PRODUCT', 1)
    yield request.param
    host.set_blas_threads(before)


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_forward_matches_naive(case, chunking, threads):
    x, W, b = _inputs(case, n=3)
    y = _conv(case)(x, W, b)
    k, s, p, d, g, cover_all = case
    numpy.testing.assert_allclose(
        y.array, naive_conv(x, W, b, k, s, p, d, g, cover_all), rtol=1e-12,
        atol=1e-12)


def test_float32_stays_float32():
    case = CASES[0]
    x, W, b = _inputs(case, numpy.float32)
    y = _conv(case)(x, W, b)
    assert y.dtype == numpy.float32
    expect = naive_conv(x.astype(float), W.astype(float), b.astype(float),
                        *case[:5], case[5])
    numpy.testing.assert_allclose(y.array, expect, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('n', [1, 2, 5])
def test_threads_split_images_then_rows(n, threads, monkeypatch):
    """On several threads a convolution deals out its images (or cuts a
    lone image's products by rows) and gives what one thread gives, to
    float64 rounding; the BLAS gets its thread count back after each op."""
    splits = []
    run_shares = _parallel._run_shares

    def counting(fn, shares):
        splits.append(len(shares))
        return run_shares(fn, shares)
    monkeypatch.setattr(_parallel, '_run_shares', counting)
    x, W, b = _inputs(CASES[0], n=n, c=4, h=9, w=9, seed=n)
    gy = numpy.random.default_rng(n).standard_normal((n, 6, 9, 9))

    def run():
        vs = [Variable(a.copy()) for a in (x, W, b)]
        y = _conv(CASES[0])(*vs)
        y.grad = gy
        y.backward()
        return [y.array] + [v.grad for v in vs]
    got = run()
    assert host.get_blas_threads() == threads
    assert (max(splits, default=1) > 1) == (threads > 1)
    host.set_blas_threads(1)
    for a, e in zip(got, run()):
        numpy.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12)


def test_pointwise_is_a_matrix_product():
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5))
    W = rng.standard_normal((7, 3, 1, 1))
    y = F.convolution_2d(x, W)
    expect = numpy.einsum('oc,nchw->nohw', W[:, :, 0, 0], x)
    numpy.testing.assert_allclose(y.array, expect, rtol=1e-12)


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_backward_float64(case, threads):
    x, W, b = _inputs(case)
    f = _conv(case)
    gy = numpy.random.default_rng(2).standard_normal(f(x, W, b).shape)
    check_backward(f, (x, W, b), gy, eps=1e-6, atol=1e-7, rtol=1e-6)


def _composite(case):
    k, s, p, d, g, cover_all = case
    return lambda x, W, b=None: _convolution_2d_composite(x, W, b, s, p,
                                                          cover_all, d, g)


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_fused_and_composite_agree(case, chunking, threads):
    x, W, b = _inputs(case)
    fused, composite = _conv(case), _composite(case)
    numpy.testing.assert_allclose(fused(x, W, b).array,
                                  composite(x, W, b).array, rtol=1e-12,
                                  atol=1e-12)
    gy = numpy.random.default_rng(3).standard_normal(fused(x, W, b).shape)
    grads = []
    for f in (fused, composite):
        vs = [Variable(a.copy()) for a in (x, W, b)]
        y = f(*vs)
        y.grad = gy
        y.backward()
        grads.append([v.grad for v in vs])
    for g1, g2 in zip(*grads):
        numpy.testing.assert_allclose(g1, g2, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_composite_backward(case):
    x, W, b = _inputs(case)
    gy = numpy.random.default_rng(3).standard_normal(_conv(case)(x, W).shape)
    check_backward(_composite(case), (x, W, b), gy, eps=1e-6, atol=1e-7,
                   rtol=1e-6)


@pytest.mark.parametrize('case', [CASES[0], CASES[2], CASES[4], CASES[6]],
                         ids=[IDS[0], IDS[2], IDS[4], IDS[6]])
def test_backward_float32(case):
    x, W, b = _inputs(case, numpy.float32)
    f = _conv(case)
    gy = numpy.random.default_rng(4).standard_normal(
        f(x, W, b).shape).astype(numpy.float32)
    check_backward(f, (x, W, b), gy, eps=1e-2, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize('case', [CASES[0], CASES[2], CASES[4], CASES[6]],
                         ids=[IDS[0], IDS[2], IDS[4], IDS[6]])
def test_double_backward(case):
    x, W, b = _inputs(case, h=4, w=4, c=2 * case[4])
    f = _conv(case)
    rng = numpy.random.default_rng(5)
    gy = rng.standard_normal(f(x, W, b).shape)
    check_double_backward(f, (x, W, b), gy,
                          tuple(rng.standard_normal(a.shape)
                                for a in (x, W, b)),
                          eps=1e-6, atol=1e-7, rtol=1e-6)


# -- deconvolution -------------------------------------------------------------
@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_deconv_forward_and_adjoint(case, chunking, threads):
    x, W, _ = _inputs(case, n=3)
    b = numpy.arange(x.shape[1]) * 0.5  # one per deconvolution output
    k, s, p, d, g, cover_all = case
    out = x.shape[2:]
    z = numpy.random.default_rng(6).standard_normal(
        _conv(case)(x, W).shape)
    y = F.deconvolution_2d(z, W, b, s, p, outsize=out, dilate=d, groups=g)
    numpy.testing.assert_allclose(
        y.array, naive_deconv(z, W, b, k, s, p, d, g, out), rtol=1e-12,
        atol=1e-12)
    # <conv(x), z> == <x, deconv(z)>: the two are adjoint.
    lhs = (_conv(case)(x, W).array * z).sum()
    rhs = (x * (y.array - b.reshape(1, -1, 1, 1))).sum()
    assert numpy.isclose(lhs, rhs, rtol=1e-12)


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_deconv_backward(case, threads):
    x, W, _ = _inputs(case)
    b = numpy.arange(x.shape[1]) * 0.5
    k, s, p, d, g, cover_all = case
    rng = numpy.random.default_rng(7)
    z = rng.standard_normal(_conv(case)(x, W).shape)

    def f(z, W, b):
        return F.deconvolution_2d(z, W, b, s, p, x.shape[2:], d, g)

    check_backward(f, (z, W, b), rng.standard_normal(x.shape), eps=1e-6,
                   atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize('case', [CASES[1], CASES[2], CASES[6]],
                         ids=[IDS[1], IDS[2], IDS[6]])
def test_deconv_of_small_maps_sums_batch_last(case, monkeypatch):
    """A batch's strided input gradient at small maps sums its columns
    images last (every image); a 1x1 window and too few images do not;
    all agree with the reference."""
    calls = []
    real = _batch_last.add_columns
    monkeypatch.setattr(_batch_last, 'add_columns',
                        lambda *a: calls.append(a[3:5]) or real(*a))
    k, s, p, d, g, cover_all = case
    for n in (2 * _im2col._BATCH_LAST_MIN_IMAGES,
              _im2col._BATCH_LAST_MIN_IMAGES - 1):
        x, W, _ = _inputs(case, n=n, h=6, w=4)
        b = numpy.arange(x.shape[1]) * 0.5
        z = numpy.random.default_rng(6).standard_normal(
            _conv(case)(x, W).shape)
        y = F.deconvolution_2d(z, W, b, s, p, outsize=(6, 4), dilate=d,
                               groups=g)
        numpy.testing.assert_allclose(
            y.array, naive_deconv(z, W, b, k, s, p, d, g, (6, 4)),
            rtol=1e-12, atol=1e-12)
        expect = n if n >= _im2col._BATCH_LAST_MIN_IMAGES and k[0] > 1 else 0
        assert sum(n1 - n0 for n0, n1 in calls) == expect
        calls.clear()


@pytest.mark.parametrize('case', [
    ((1, 1), (2, 2), (0, 0), (1, 1), 1, False),
    ((1, 1), (2, 3), (0, 0), (1, 1), 2, True),  # the last window past x
    ((1, 1), (3, 1), (0, 0), (2, 2), 1, True)], ids=['s2', 's23g2c', 's31c'])
def test_strided_pointwise_takes_the_pixels_read(case, monkeypatch):
    """A strided 1x1 convolution, its weight and input gradients run as
    pointwise ones over the pixels read (``_strided_pointwise.py``) and
    agree with the references; float64 gradients check."""
    calls = []
    real = _strided_pointwise.take
    monkeypatch.setattr(_strided_pointwise, 'take',
                        lambda *a: calls.append(1) or real(*a))
    k, s, p, d, g, cover_all = case
    x, W, b = _inputs(case, n=3, h=7, w=6)
    y = _conv(case)(x, W, b)
    numpy.testing.assert_allclose(
        y.array, naive_conv(x, W, b, *case), rtol=1e-12, atol=1e-12)
    z = numpy.random.default_rng(6).standard_normal(y.shape)
    bz = numpy.arange(x.shape[1]) * 0.5
    yd = F.deconvolution_2d(z, W, bz, s, p, outsize=(7, 6), dilate=d,
                            groups=g)
    numpy.testing.assert_allclose(
        yd.array, naive_deconv(z, W, bz, k, s, p, d, g, (7, 6)),
        rtol=1e-12, atol=1e-12)
    assert calls
    check_backward(_conv(case), (x, W, b), z, eps=1e-6, atol=1e-7,
                   rtol=1e-6)


def test_deconv_default_outsize():
    x = numpy.zeros((1, 2, 3, 4))
    W = numpy.zeros((2, 5, 3, 2))
    y = F.deconvolution_2d(x, W, stride=(2, 3), pad=1)
    # (h - 1)*s + k - 2p
    assert y.shape == (1, 5, (3 - 1) * 2 + 3 - 2, (4 - 1) * 3 + 2 - 2)


# -- im2col ------------------------------------------------------------------
@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_im2col(case):
    k, s, p, d, g, cover_all = case
    x = numpy.random.default_rng(8).standard_normal((2, 3, 5, 5))
    col = F.im2col(x, k, s, p, cover_all, d)
    oh, ow = _sizes(5, 5, k, s, p, d, cover_all)
    assert col.shape == (2, 3 * k[0] * k[1], oh, ow)
    xp = numpy.pad(x, ((0, 0), (0, 0), (p[0], p[0] + s[0] + d[0] * k[0]),
                       (p[1], p[1] + s[1] + d[1] * k[1])))
    c6 = col.array.reshape(2, 3, k[0], k[1], oh, ow)
    for ky in range(k[0]):
        for kx in range(k[1]):
            r, q = ky * d[0], kx * d[1]
            numpy.testing.assert_array_equal(
                c6[:, :, ky, kx],
                xp[:, :, r:r + s[0] * (oh - 1) + 1:s[0],
                   q:q + s[1] * (ow - 1) + 1:s[1]])
    gy = numpy.random.default_rng(9).standard_normal(col.shape)
    check_backward(lambda x: F.im2col(x, k, s, p, cover_all, d), x, gy,
                   eps=1e-6, atol=1e-7, rtol=1e-6)
    check_double_backward(lambda x: F.im2col(x, k, s, p, cover_all, d) ** 2,
                          x, gy, numpy.ones_like(x), eps=1e-6, atol=1e-6,
                          rtol=1e-5)


# -- errors ------------------------------------------------------------------
def _raises(exc, pattern, *args, func=F.convolution_2d, **kwargs):
    with pytest.raises(exc, match=pattern):
        func(*args, **kwargs)


def test_errors():
    x = numpy.zeros((2, 3, 5, 5), numpy.float32)
    W = numpy.zeros((4, 3, 3, 3), numpy.float32)
    _raises(ValueError, r'convolution_2d: x must be 4-D .*\(3, 5, 5\)',
            x[0], W)
    _raises(ValueError, r'convolution_2d: x has 3 channels .* W of shape '
            r'\(4, 2, 3, 3\) with groups=1 expects 2', x, W[:, :2])
    _raises(ValueError, r'convolution_2d: the kernel \(8x8.*larger than the '
            r'padded input \(7x7\)', x, numpy.zeros((4, 3, 8, 8),
                                                    numpy.float32), pad=1)
    _raises(ValueError, r'dilated extent 7x7', x,
            numpy.zeros((4, 3, 3, 3), numpy.float32), dilate=3)
    _raises(ValueError, r'convolution_2d: groups=2 must divide .*\(2, 3, 5, '
            r'5\)', x, W, groups=2)
    _raises(ValueError, r'convolution_2d: b must have shape \(4,\).*\(3,\)',
            x, W, numpy.zeros(3, numpy.float32))
    _raises(TypeError, r'convolution_2d: inputs must share one dtype',
            x, W.astype(numpy.float64))
    _raises(TypeError, r'convolution_2d: x must be floating point',
            x.astype(numpy.int32), W)
    _raises(ValueError, r'convolution_2d: stride must be .* got 0', x, W,
            stride=0)
    _raises(ValueError, r'deconvolution_2d: x has 3 channels .*\(4, 3, 3, 3\)',
            x, W, func=F.deconvolution_2d)
    _raises(ValueError, r'deconvolution_2d: outsize \(9, 9\) is not a size',
            x, W[:3], outsize=(9, 9), func=F.deconvolution_2d)
    _raises(ValueError, r'im2col: x must be 4-D', x[0], 3, func=F.im2col)


def test_deconv_accepts_cover_all_outsize():
    # conv(7, k=2, s=3, cover_all) -> 3 = conv(6 or 5, ...) without it.
    x = numpy.ones((1, 1, 3, 3))
    W = numpy.ones((1, 1, 2, 2))
    y = F.deconvolution_2d(x, W, stride=3, outsize=(7, 7))
    assert y.shape == (1, 1, 7, 7)
    z = Variable(numpy.ones((1, 1, 7, 7)))
    F.sum(F.convolution_2d(z, W, stride=3, cover_all=True)).backward()
    assert z.grad.shape == (1, 1, 7, 7)


# -- GPU ---------------------------------------------------------------------
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_cuda_kernels_emulated(case, dtype, emulated_cuda):  # noqa: F811
    """The CUDA im2col/col2im kernels, run as C++ on the CPU, equal NumPy."""
    k, s, p, d, _, cover_all = case
    rng = numpy.random.default_rng(11)
    x = rng.standard_normal((3, 4, 7, 6)).astype(dtype)
    out = _sizes(7, 6, k, s, p, d, cover_all)
    g = _im2col.Geometry(k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1], 7, 6,
                         out[0], out[1])
    ref = _im2col.im2col(x, g)
    numpy.testing.assert_array_equal(emulated_cuda.im2col(x, g, True), ref)
    numpy.testing.assert_array_equal(emulated_cuda.im2col(x, g, False),
                                     ref.transpose(1, 2, 3, 0, 4, 5))
    col = rng.standard_normal(ref.shape).astype(dtype)
    expect = _im2col.col2im(col, g)
    numpy.testing.assert_allclose(emulated_cuda.col2im(col, g, True), expect,
                                  rtol=1e-5, atol=1e-5)
    channel_major = numpy.ascontiguousarray(col.transpose(1, 2, 3, 0, 4, 5))
    numpy.testing.assert_allclose(emulated_cuda.col2im(channel_major, g, False),
                                  expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('case', CASES, ids=IDS)
@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_gpu_matches_cpu(case):
    k, s, p, d, g, cover_all = case
    x, W, b = _inputs(case, numpy.float32, n=3, h=7, w=6)
    rng = numpy.random.default_rng(10)
    outs = []
    for to in (lambda a: a, backend.to_gpu):
        vs = [Variable(to(a.copy())) for a in (x, W, b)]
        y = _conv(case)(*vs)
        gy = to(rng.standard_normal(y.shape).astype(numpy.float32))
        y.grad = gy
        y.backward()
        z = F.deconvolution_2d(gy, vs[1], vs[0][0, :, 0, 0], s, p,
                               x.shape[2:], d, g)
        col = F.im2col(vs[0], k, s, p, cover_all, d)
        outs.append([backend.to_cpu(a) for a in
                     (y.array, vs[0].grad, vs[1].grad, vs[2].grad, z.array,
                      col.array)])
        rng = numpy.random.default_rng(10)
    for cpu, gpu_ in zip(*outs):
        numpy.testing.assert_allclose(gpu_, cpu, rtol=1e-4, atol=1e-4)
