"""max_pooling_2d, average_pooling_2d, global_average_pooling_2d."""
import numpy
import pytest

from minichain import Variable, backend
import minichain.functions as F
from minichain.functions import geometry
from minichain.gradient_check import check_backward, check_double_backward
from minichain.functions.pooling import _pool_geometry
from tests.functions.cuda_emulation import emulated_cuda  # noqa: F401

# (ksize, stride, pad, cover_all)
CASES = [
    ((3, 3), (2, 2), (1, 1), True),    # ResNet's stem pooling
    ((3, 3), (2, 2), (1, 1), False),
    ((2, 2), None, (0, 0), True),
    ((3, 2), (1, 2), (1, 0), False),
    ((2, 3), (3, 1), (0, 1), True),
]
IDS = ['k{}s{}p{}{}'.format(k, s, p, 'c' if c else '')
       for k, s, p, c in CASES]


def _windows(x, k, s, p, cover_all):
    """Yield (i, j, window) for every output position (naive loops)."""
    s = s or k
    n, c, h, w = x.shape
    oh = geometry.conv_outsize(h, k[0], s[0], p[0], cover_all)
    ow = geometry.conv_outsize(w, k[1], s[1], p[1], cover_all)
    for i in range(oh):
        for j in range(ow):
            cells = [x[:, :, r, q]
                     for r in range(i * s[0] - p[0], i * s[0] - p[0] + k[0])
                     for q in range(j * s[1] - p[1], j * s[1] - p[1] + k[1])
                     if 0 <= r < h and 0 <= q < w]
            yield i, j, oh, ow, cells


def naive_max(x, k, s, p, cover_all):
    out = None
    for i, j, oh, ow, cells in _windows(x, k, s, p, cover_all):
        if out is None:
            out = numpy.full(x.shape[:2] + (oh, ow), -numpy.inf)
        for v in cells:
            out[:, :, i, j] = numpy.maximum(out[:, :, i, j], v)
    return out


def naive_avg(x, k, s, p):
    out = None
    for i, j, oh, ow, cells in _windows(x, k, s, p, False):
        if out is None:
            out = numpy.zeros(x.shape[:2] + (oh, ow))
        out[:, :, i, j] = sum(cells) / (k[0] * k[1])
    return out


def _shuffled(shape, dtype=numpy.float64, seed=0):
    """Distinct values 0.1 apart: no ties and no kinks within eps."""
    rng = numpy.random.default_rng(seed)
    size = int(numpy.prod(shape))
    return (rng.permutation(size).reshape(shape) * 0.1).astype(dtype)


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_max_forward(case):
    x = _shuffled((2, 3, 5, 7))
    y = F.max_pooling_2d(x, *case)
    numpy.testing.assert_array_equal(y.array, naive_max(x, *case))


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_max_backward(case):
    x = _shuffled((2, 3, 5, 7))
    f = lambda x: F.max_pooling_2d(x, *case)  # noqa: E731
    rng = numpy.random.default_rng(1)
    gy = rng.standard_normal(f(x).shape)
    check_backward(f, x, gy, eps=1e-3, atol=1e-7, rtol=1e-6)
    check_double_backward(lambda x: f(x) * f(x), x, gy,
                          rng.standard_normal(x.shape), eps=1e-3, atol=1e-6,
                          rtol=1e-5)
    x32 = x.astype(numpy.float32)
    check_backward(f, x32, gy.astype(numpy.float32), eps=1e-2, atol=1e-3,
                   rtol=1e-3)


def test_max_ties_go_to_the_first_maximum():
    x = Variable(numpy.ones((1, 1, 4, 4)))
    y = F.max_pooling_2d(x, 2)
    F.sum(y).backward()
    expect = numpy.zeros((4, 4))
    expect[::2, ::2] = 1
    numpy.testing.assert_array_equal(x.grad[0, 0], expect)


def test_max_window_inside_padding_gives_minus_inf():
    # cover_all with a stride past the window: the last row of windows
    # starts at row 5 of a 5-row input and sees only padding (as in Chainer).
    x = Variable(_shuffled((1, 1, 5, 3)))
    y = F.max_pooling_2d(x, (2, 3), stride=(3, 1), pad=1, cover_all=True)
    assert y.shape == (1, 1, 3, 3)
    assert numpy.all(y.array[0, 0, 2] == -numpy.inf)
    assert numpy.all(numpy.isfinite(y.array[0, 0, :2]))
    F.sum(y[:, :, :2]).backward()
    assert x.grad.sum() == 6  # each finite window sends 1 to one pixel


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_average(case):
    k, s, p, _ = case
    x = numpy.random.default_rng(2).standard_normal((2, 3, 5, 7))
    y = F.average_pooling_2d(x, k, s, p)
    numpy.testing.assert_allclose(y.array, naive_avg(x, k, s, p), rtol=1e-12)
    rng = numpy.random.default_rng(3)
    gy = rng.standard_normal(y.shape)
    f = lambda x: F.average_pooling_2d(x, k, s, p)  # noqa: E731
    check_backward(f, x, gy, eps=1e-4, atol=1e-7, rtol=1e-6)
    check_double_backward(lambda x: f(x) ** 2, x, gy,
                          rng.standard_normal(x.shape), eps=1e-4, atol=1e-6,
                          rtol=1e-5)
    check_backward(f, x.astype(numpy.float32), gy.astype(numpy.float32),
                   eps=1e-2, atol=1e-3, rtol=1e-3)


def test_average_counts_padding_as_zeros():
    x = numpy.ones((1, 1, 2, 2))
    y = F.average_pooling_2d(x, 2, stride=1, pad=1)
    # corners see 1 of 4 pixels, edges 2, the centre 4
    numpy.testing.assert_allclose(y.array[0, 0], [[.25, .5, .25],
                                                  [.5, 1., .5],
                                                  [.25, .5, .25]])


def test_global_average():
    x = numpy.random.default_rng(4).standard_normal((2, 3, 4, 5))
    y = F.global_average_pooling_2d(x)
    assert y.shape == (2, 3, 1, 1)
    numpy.testing.assert_allclose(y.array,
                                  F.average_pooling_2d(x, (4, 5)).array,
                                  rtol=1e-12)
    gy = numpy.random.default_rng(5).standard_normal(y.shape)
    check_backward(F.global_average_pooling_2d, x, gy, eps=1e-4, atol=1e-7,
                   rtol=1e-6)
    check_double_backward(lambda x: F.global_average_pooling_2d(x) ** 2, x,
                          gy, numpy.ones_like(x), eps=1e-4, atol=1e-6,
                          rtol=1e-5)
    assert F.global_average_pooling_2d(x.astype(numpy.float32)).dtype == \
        numpy.float32


def test_errors():
    x = numpy.zeros((2, 3, 4, 4), numpy.float32)
    with pytest.raises(ValueError, match=r'max_pooling_2d: x must be 4-D .*'
                       r'\(3, 4, 4\)'):
        F.max_pooling_2d(x[0], 2)
    with pytest.raises(ValueError, match=r'average_pooling_2d: the window '
                       r'\(7, 7\) is larger than the padded input \(6x6\)'):
        F.average_pooling_2d(x, 7, pad=1)
    with pytest.raises(ValueError, match=r'max_pooling_2d: ksize must be'):
        F.max_pooling_2d(x, 0)
    with pytest.raises(TypeError, match=r'global_average_pooling_2d: x must '
                       r'be floating point'):
        F.global_average_pooling_2d(x.astype(numpy.int64))
    with pytest.raises(ValueError, match=r'global_average_pooling_2d: x must '
                       r'be 4-D'):
        F.global_average_pooling_2d(x[0])


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_cuda_kernels_emulated(case, dtype, emulated_cuda):  # noqa: F811
    """The CUDA pooling kernels, run as C++ on the CPU, equal NumPy."""
    k, s, p, cover_all = case
    rng = numpy.random.default_rng(8)
    x = _shuffled((2, 3, 7, 6), dtype)
    for name in ('max', 'avg'):
        g = _pool_geometry('test', x, k, s, p, cover_all and name == 'max')
        v = Variable(x.copy())
        y = (F.max_pooling_2d(v, k, s, p, cover_all) if name == 'max'
             else F.average_pooling_2d(v, k, s, p))
        gy = Variable(rng.standard_normal(y.shape).astype(dtype))
        y.grad_var = gy
        y.backward(enable_double_backprop=True)
        ggx = rng.standard_normal(x.shape).astype(dtype)
        v.grad_var.grad = ggx
        v.grad_var.backward()
        if name == 'max':
            out, idx = emulated_cuda.max_pool_forward(x, g)
            numpy.testing.assert_array_equal(idx, y.creator.indexes)
            ties = numpy.floor(x)  # ten equal values per integer
            numpy.testing.assert_array_equal(
                emulated_cuda.max_pool_forward(ties, g)[1],
                F.max_pooling_2d(Variable(ties), k, s, p,
                                 cover_all).creator.indexes)
            gx = emulated_cuda.max_pool_backward(gy.array, idx, g)
            numpy.testing.assert_array_equal(
                emulated_cuda.max_pool_gather(ggx, idx, g), gy.grad)
        else:
            out = emulated_cuda.avg_pool_forward(x, g)
            gx = emulated_cuda.avg_pool_backward(gy.array, g)
        numpy.testing.assert_allclose(out, y.array, rtol=1e-6)
        numpy.testing.assert_allclose(gx, v.grad, rtol=1e-5, atol=1e-6)


def _with_nans(dtype):
    """Distinct values with NaN planted: single ones, two in a row, and a
    row of NaN (so that some windows hold only NaN)."""
    x = _shuffled((2, 3, 7, 6), dtype)
    x[0, 0, 1, 1] = x[0, 0, 1, 2] = x[1, 2, 4, 3] = numpy.nan
    x[0, 1, 0, :] = numpy.nan
    return x


def naive_choice(x, case):
    """Window-local index of each window's pick: its first NaN, else its
    first maximum (-1 for a window of padding only), and the gradient of
    sum(y) that follows from it."""
    k, s, p, cover_all = case
    s = s or k
    idx = gx = None
    for i, j, oh, ow, _ in _windows(x, k, s, p, cover_all):
        if idx is None:
            idx = numpy.full(x.shape[:2] + (oh, ow), -1)
            gx = numpy.zeros(x.shape)
        for n in range(x.shape[0]):
            for c in range(x.shape[1]):
                best = None
                for r in range(k[0]):
                    for q in range(k[1]):
                        y, z = i * s[0] - p[0] + r, j * s[1] - p[1] + q
                        if not (0 <= y < x.shape[2] and 0 <= z < x.shape[3]):
                            continue
                        v = x[n, c, y, z]
                        nan_wins = numpy.isnan(v) and not (
                            best is not None and numpy.isnan(best[0]))
                        if best is None or nan_wins or v > best[0]:
                            best = (v, r * k[1] + q, y, z)
                if best is not None:
                    idx[n, c, i, j] = best[1]
                    gx[n, c, best[2], best[3]] += 1
    return idx, gx


@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_max_nan_propagates_and_takes_the_gradient(case):
    x = _with_nans(numpy.float32)
    idx, gx = naive_choice(x, case)
    v = Variable(x.copy())
    y = F.max_pooling_2d(v, *case)
    want = naive_max(x, *case)  # numpy.maximum propagates NaN
    assert numpy.isnan(want).any()
    numpy.testing.assert_array_equal(y.array, want)
    numpy.testing.assert_array_equal(y.creator.indexes, idx)
    y.grad = numpy.ones(y.shape, numpy.float32)
    y.backward()
    numpy.testing.assert_array_equal(v.grad, gx)


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('case', CASES, ids=IDS)
def test_cuda_max_kernel_agrees_on_nan(case, dtype, emulated_cuda):  # noqa
    """The CUDA max kernel (as C++ on the CPU) propagates NaN and picks the
    same pixel as the NumPy path (``v > best`` alone dropped NaN)."""
    x = _with_nans(dtype)
    k, s, p, cover_all = case
    g = _pool_geometry('test', x, k, s, p, cover_all)
    out, idx = emulated_cuda.max_pool_forward(x, g)
    numpy.testing.assert_array_equal(out, naive_max(x, *case))
    numpy.testing.assert_array_equal(idx, naive_choice(x, case)[0])


@pytest.mark.parametrize('case', CASES, ids=IDS)
@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_gpu_matches_cpu(case):
    k, s, p, cover_all = case
    x = _shuffled((2, 3, 7, 6), numpy.float32)
    gy_max = numpy.random.default_rng(6).standard_normal(
        F.max_pooling_2d(x, *case).shape).astype(numpy.float32)
    gy_avg = numpy.random.default_rng(7).standard_normal(
        F.average_pooling_2d(x, k, s, p).shape).astype(numpy.float32)
    results = []
    for to in (lambda a: a, backend.to_gpu):
        out = []
        for f, gy in ((lambda v: F.max_pooling_2d(v, *case), gy_max),
                      (lambda v: F.average_pooling_2d(v, k, s, p), gy_avg)):
            v = Variable(to(x.copy()))
            y = f(v)
            gyv = Variable(to(gy))
            y.grad_var = gyv
            y.backward(enable_double_backprop=True)
            gx = v.grad_var
            # second order: through the grad node back to gy
            F.sum(gx * gx).backward()
            out += [backend.to_cpu(a) for a in (y.array, gx.array, gyv.grad)]
        results.append(out)
    for cpu, gpu_ in zip(*results):
        numpy.testing.assert_allclose(gpu_, cpu, rtol=1e-5, atol=1e-5)
