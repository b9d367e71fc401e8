import numpy
import pytest

import minichain.functions as F
from minichain import Variable, backend, using_config
from minichain.functions import loss as loss_module
from minichain.gradient_check import check_backward, check_double_backward

TOL = {numpy.float64: (1e-5, 1e-6, 1e-5), numpy.float32: (1e-2, 5e-3, 1e-2)}


def _randn(shape, seed=0, dtype=numpy.float64):
    return numpy.asarray(numpy.random.RandomState(seed).randn(*shape), dtype)


def _np_sce(x, t, ignore_label=-1, reduce='mean'):
    """Reference: loop over samples and positions, plain log-sum-exp."""
    x = x.astype(numpy.float64)
    xc = numpy.moveaxis(x, 1, -1).reshape(-1, x.shape[1])
    tf = t.reshape(-1)
    loss = numpy.zeros(len(tf))
    for i, (row, label) in enumerate(zip(xc, tf)):
        if label != ignore_label:
            m = row.max()
            loss[i] = m + numpy.log(numpy.exp(row - m).sum()) - row[label]
    if reduce == 'no':
        return loss.reshape(t.shape)
    return loss.sum() / max((tf != ignore_label).sum(), 1)


def _labels(shape, n_class, seed=0, n_ignored=0):
    t = numpy.random.RandomState(seed).randint(0, n_class, shape)
    t.reshape(-1)[:n_ignored] = -1
    return t.astype(numpy.int32)


CASES = [((4, 3), 0), ((4, 3), 2), ((2, 3, 2, 2), 3)]


@pytest.mark.parametrize('x_shape,n_ignored', CASES)
@pytest.mark.parametrize('reduce', ['mean', 'no'])
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_sce_forward(x_shape, n_ignored, reduce, dtype):
    x = _randn(x_shape, dtype=dtype) * 3
    t = _labels(x_shape[:1] + x_shape[2:], x_shape[1], n_ignored=n_ignored)
    y = F.softmax_cross_entropy(x, t, reduce=reduce)
    assert y.dtype == dtype
    assert y.shape == (() if reduce == 'mean' else t.shape)
    rtol = 1e-6 if dtype == numpy.float64 else 1e-5
    numpy.testing.assert_allclose(y.array, _np_sce(x, t, reduce=reduce),
                                  rtol=rtol, atol=1e-7)


@pytest.mark.parametrize('x_shape,n_ignored', CASES)
@pytest.mark.parametrize('reduce', ['mean', 'no'])
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_sce_backward(x_shape, n_ignored, reduce, dtype):
    eps, atol, rtol = TOL[dtype]
    x = _randn(x_shape, dtype=dtype)
    t = _labels(x_shape[:1] + x_shape[2:], x_shape[1], n_ignored=n_ignored)
    gy = None if reduce == 'mean' else _randn(t.shape, 1, dtype)
    check_backward(lambda v, u: F.softmax_cross_entropy(v, u, reduce=reduce),
                   (x, t), gy, eps=eps, atol=atol, rtol=rtol)


@pytest.mark.parametrize('reduce', ['mean', 'no'])
def test_sce_double_backward(reduce):
    x = _randn((3, 4))
    t = _labels((3,), 4, n_ignored=1)
    gy = _randn((), 1) if reduce == 'mean' else _randn((3,), 1)
    check_double_backward(
        lambda v, u: F.softmax_cross_entropy(v, u, reduce=reduce), (x, t),
        gy, _randn((3, 4), 2), eps=1e-5, atol=1e-6, rtol=1e-5)


def test_sce_gradient_is_softmax_minus_onehot():
    x = Variable(_randn((3, 4)))
    t = numpy.array([2, -1, 0], dtype=numpy.int64)
    F.softmax_cross_entropy(x, t).backward()
    e = numpy.exp(x.array)
    expected = e / e.sum(1, keepdims=True)
    expected[[0, 2], [2, 0]] -= 1
    expected[1] = 0  # ignored sample
    numpy.testing.assert_allclose(x.grad, expected / 2, rtol=1e-12)


def test_sce_custom_ignore_label_and_all_ignored():
    x = _randn((3, 4))
    t = numpy.array([1, 7, 7], dtype=numpy.int32)
    y = F.softmax_cross_entropy(x, t, ignore_label=7)
    numpy.testing.assert_allclose(y.array, _np_sce(x, t, ignore_label=7))
    v = Variable(x)
    y = F.softmax_cross_entropy(v, numpy.full(3, -1, numpy.int32))
    assert float(y.array) == 0.0
    y.backward()
    numpy.testing.assert_array_equal(v.grad, numpy.zeros((3, 4)))


def test_sce_large_logits_are_stable():
    x = numpy.array([[1000.0, 0.0, -1000.0]], dtype=numpy.float32)
    y = F.softmax_cross_entropy(x, numpy.array([2]), reduce='no')
    numpy.testing.assert_allclose(y.array, [2000.0], rtol=1e-6)


def test_sce_errors():
    x = _randn((4, 3))
    with pytest.raises(TypeError, match=r'softmax_cross_entropy: t .*float64'):
        F.softmax_cross_entropy(x, numpy.zeros(4))
    with pytest.raises(TypeError, match=r'softmax_cross_entropy: x .*int64'):
        F.softmax_cross_entropy(numpy.zeros((4, 3), numpy.int64),
                                numpy.zeros(4, numpy.int64))
    with pytest.raises(ValueError,
                       match=r'softmax_cross_entropy: x of shape \(4, 3\).*'
                             r't of shape \(5,\)'):
        F.softmax_cross_entropy(x, numpy.zeros(5, numpy.int32))
    with pytest.raises(ValueError, match=r'softmax_cross_entropy.*\(4,\)'):
        F.softmax_cross_entropy(_randn((4,)), numpy.zeros(4, numpy.int32))
    with pytest.raises(ValueError,
                       match=r'softmax_cross_entropy: label 3 .*\[0, 3\)'):
        F.softmax_cross_entropy(x, numpy.array([0, 1, 3, 2]))
    with pytest.raises(ValueError, match=r'label -2'):
        F.softmax_cross_entropy(x, numpy.array([0, 1, -2, 2]))
    with pytest.raises(ValueError, match=r"reduce must be 'mean' or 'no'"):
        F.softmax_cross_entropy(x, numpy.zeros(4, numpy.int32), reduce='sum')


@pytest.mark.parametrize('debug', [False, True])
def test_sce_label_range_checked_on_numpy_in_any_mode(debug):
    # On the host the check costs no device sync, so it stays on outside
    # debug mode too.
    x = _randn((4, 3))
    with using_config('debug', debug):
        with pytest.raises(ValueError,
                           match=r'softmax_cross_entropy: label 3 is out of '
                                 r'range \[0, 3\) for x of shape \(4, 3\) '
                                 r'\(ignore_label=-1\)'):
            F.softmax_cross_entropy(x, numpy.array([0, 1, 3, 2]))


def test_sce_label_range_on_device_only_in_debug(monkeypatch):
    # Labels that are not NumPy arrays (CuPy's) are checked only in debug
    # mode. Emulated on the CPU: with the module's ``numpy`` swapped out,
    # NumPy labels look like device labels. (-2 wraps around in
    # take_along_axis, so the unchecked forward still runs.)
    monkeypatch.setattr(loss_module, 'numpy', object())
    x, t = _randn((4, 3)), numpy.array([0, 1, -2, 2])
    with using_config('debug', False):
        F.softmax_cross_entropy(x, t)  # no check, so no sync on a GPU
    with using_config('debug', True):
        with pytest.raises(ValueError, match=r'label -2'):
            F.softmax_cross_entropy(x, t)


@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_mse_forward_backward(dtype):
    eps, atol, rtol = TOL[dtype]
    a, b = _randn((3, 4), 0, dtype), _randn((3, 4), 1, dtype)
    y = F.mean_squared_error(a, b)
    assert y.shape == () and y.dtype == dtype
    ref = ((a.astype(numpy.float64) - b) ** 2).mean()
    rtol = 1e-6 if dtype == numpy.float64 else 1e-5
    numpy.testing.assert_allclose(y.array, ref, rtol=rtol)
    check_backward(F.mean_squared_error, (a, b), None, eps=eps, atol=atol,
                   rtol=rtol)


def test_mse_double_backward():
    a, b = _randn((2, 3), 0), _randn((2, 3), 1)
    check_double_backward(F.mean_squared_error, (a, b), _randn((), 2),
                          (_randn((2, 3), 3), _randn((2, 3), 4)),
                          eps=1e-5, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('name', ['mean_squared_error', 'squared_error'])
def test_squared_error_errors(name):
    f = getattr(F, name)
    with pytest.raises(ValueError,
                       match=name + r': .*\(2, 3\) and \(3, 2\)'):
        f(_randn((2, 3)), _randn((3, 2)))
    with pytest.raises(TypeError, match=name + r': .*float32'):
        f(_randn((2, 3)), _randn((2, 3), 0, numpy.float32))
    with pytest.raises(TypeError, match=name + r': x1 .*int64'):
        f(_randn((2,)), numpy.arange(2))


def test_squared_error_is_chainers():
    # Chainer v7.8.1's docstring example: not halved, not reduced.
    x1 = numpy.arange(6).astype(numpy.float32)
    x2 = numpy.array([5, 4, 3, 2, 1, 0]).astype(numpy.float32)
    for f in (F.squared_error, F.squared_difference):
        y = f(x1, x2)
        assert y.shape == (6,) and y.dtype == numpy.float32
        numpy.testing.assert_array_equal(y.array, [25, 9, 1, 1, 9, 25])
    assert F.squared_error(numpy.array(3.0), numpy.array(1.0)).array == 4


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('shape', [(4, 3), ()])
def test_squared_error_backward(shape, dtype):
    # As Chainer's test_squared_error.py: gradients of both inputs, twice.
    eps, atol, rtol = TOL[dtype]
    a, b = _randn(shape, 0, dtype), _randn(shape, 1, dtype)
    y = F.squared_error(a, b)
    numpy.testing.assert_allclose(y.array, (a - b) ** 2, rtol=1e-6)
    gy = _randn(shape, 2, dtype)
    check_backward(F.squared_error, (a, b), gy, eps=eps, atol=atol,
                   rtol=rtol)
    if dtype == numpy.float64:
        check_double_backward(F.squared_error, (a, b), gy,
                              (_randn(shape, 3), _randn(shape, 4)),
                              eps=1e-5, atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('reduce', ['mean', 'no'])
def test_gpu_matches_cpu(reduce):
    x = _randn((2, 3, 2, 2), dtype=numpy.float32)
    t = _labels((2, 2, 2), 3, n_ignored=2)
    results = []
    for to in (lambda a: a, backend.to_gpu):
        v = Variable(to(x))
        y = F.softmax_cross_entropy(v, to(t), reduce=reduce)
        F.sum(y * 1.0).backward()
        mse = F.mean_squared_error(v, to(x[::-1].copy()))
        results.append((backend.to_cpu(y.array), backend.to_cpu(v.grad),
                        backend.to_cpu(mse.array)))
    for cpu, gpu in zip(*results):
        numpy.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=1e-6)
    # On the GPU the label range is checked in debug mode only (it syncs).
    xg, tg = backend.to_gpu(x[:, :, 0, 0]), backend.to_gpu(numpy.array([0, 5]))
    with using_config('debug', False):
        F.softmax_cross_entropy(xg, tg)
    with using_config('debug', True):
        with pytest.raises(ValueError, match='label 5'):
            F.softmax_cross_entropy(xg, tg)



INF = numpy.inf
FINITE_ROW = [0.5, 1.0, -1.0]


@pytest.mark.parametrize('row, label, loss, grad', [
    ([INF, 0, 0], 0, 0.0, [0, 0, 0]),                 # the limit: certain
    ([INF, 0, 0], 1, INF, [1, -1, 0]),                # certainly wrong
    ([INF, INF, 0], 0, numpy.log(2), [-0.5, 0.5, 0]),  # shared
    ([-INF, -INF, -INF], 1, numpy.log(3), [1 / 3, -2 / 3, 1 / 3]),  # uniform
    ([-INF, 0, 0], 1, numpy.log(2), [0, -0.5, 0.5]),
])
def test_sce_infinite_logits_give_the_limits(row, label, loss, grad):
    x = Variable(numpy.array([row, FINITE_ROW]))
    y = F.softmax_cross_entropy(x, numpy.array([label, 2]), reduce='no')
    assert y.array[0] == (pytest.approx(loss) if numpy.isfinite(loss)
                          else loss)
    y.grad = numpy.ones(2)
    y.backward()
    numpy.testing.assert_allclose(x.grad[0], grad, atol=1e-12)
    alone = Variable(numpy.array([FINITE_ROW]))
    y_alone = F.softmax_cross_entropy(alone, numpy.array([2]), reduce='no')
    y_alone.grad = numpy.ones(1)
    y_alone.backward()  # the finite row is untouched by its neighbour
    assert y.array[1] == y_alone.array[0]
    numpy.testing.assert_array_equal(x.grad[1], alone.grad[0])
    mean = F.softmax_cross_entropy(numpy.array([row, FINITE_ROW]),
                                   numpy.array([label, 2]))
    assert mean.array == pytest.approx((loss + y_alone.array[0]) / 2)


def test_sce_ignored_rows_and_nan():
    x = numpy.array([[-INF, -INF, 0.0], [0.0, 1.0, 2.0]])
    y = F.softmax_cross_entropy(x, numpy.array([-1, 0]))
    assert numpy.isfinite(y.array)  # -inf at an ignored label: no NaN
    nan = F.softmax_cross_entropy(numpy.array([[numpy.nan, 0.0]]),
                                  numpy.array([1]))
    assert numpy.isnan(nan.array)  # NaN stays NaN


def test_sce_double_backward_with_an_infinite_row():
    v = Variable(numpy.array([[INF, 0.0, 1.0], [0.3, -0.2, 0.1]]))
    F.softmax_cross_entropy(v, numpy.array([1, 0])).backward(
        enable_double_backprop=True)
    gx = v.grad_var
    v.cleargrad()
    F.sum(gx * gx).backward()
    assert numpy.isfinite(v.grad).all()
    assert (v.grad[0] == 0).all()  # the limit does not move with x


def test_float16_losses_are_summed_past_65504():
    """4096 samples at a loss of 16 sum to 65536, inf in float16: the mean
    is 16 all the same (the sum is taken in float32)."""
    x = numpy.zeros((4096, 2), numpy.float16)
    x[:, 0] = 16  # label 1: loss = log(1 + e^16) - 0, about 16
    y = F.softmax_cross_entropy(x, numpy.ones(4096, numpy.int32))
    assert y.dtype == numpy.float16
    assert y.array == pytest.approx(16.0, rel=1e-3)
    x0 = numpy.full((4096, 2), 6, numpy.float16)  # 36 per element
    mse = F.mean_squared_error(x0, numpy.zeros_like(x0))
    assert mse.dtype == numpy.float16 and mse.array == 36
