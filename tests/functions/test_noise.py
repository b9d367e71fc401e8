import numpy
import pytest

import minichain
import minichain.functions as F
from minichain import Variable, backend
from minichain.gradient_check import check_backward, check_double_backward


def _randn(shape, seed=0, dtype=numpy.float64):
    return numpy.asarray(numpy.random.RandomState(seed).randn(*shape), dtype)


@pytest.mark.parametrize('ratio', [0.1, 0.5, 0.8])
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_train_mode_drops_and_scales(ratio, dtype):
    x = numpy.random.RandomState(0).uniform(1, 2, (100, 100)).astype(dtype)
    y = F.dropout(x, ratio, rng=numpy.random.RandomState(1))
    assert y.shape == x.shape and y.dtype == dtype
    dropped = y.array == 0
    # 10^4 Bernoulli draws: the fraction is within ~4 standard deviations.
    assert abs(dropped.mean() - ratio) < 0.02
    numpy.testing.assert_allclose(y.array[~dropped],
                                  x[~dropped] / (1 - ratio), rtol=1e-6)


def test_test_mode_is_identity():
    x = Variable(_randn((3, 4)))
    with minichain.using_config('train', False):
        y = F.dropout(x, 0.5)
    numpy.testing.assert_array_equal(y.array, x.array)
    assert y.creator is None
    y0 = F.dropout(x, 0.0)  # nothing to drop, even in training
    numpy.testing.assert_array_equal(y0.array, x.array)


def test_backward_uses_the_forward_mask():
    x = Variable(numpy.ones((20, 20)))
    y = F.dropout(x, 0.4)
    y.grad = numpy.full(y.shape, 3.0)
    y.backward()
    expected = numpy.where(y.array == 0, 0.0, 3.0 / 0.6)
    numpy.testing.assert_allclose(x.grad, expected, rtol=1e-12)


@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_gradient_check(dtype):
    # A fixed generator gives the same mask on every numerical forward.
    def f(v):
        return F.dropout(v, 0.3, rng=numpy.random.RandomState(2))

    eps, atol, rtol = ((1e-5, 1e-6, 1e-5) if dtype == numpy.float64
                       else (1e-2, 1e-2, 1e-2))
    x, gy = _randn((4, 5), 0, dtype), _randn((4, 5), 1, dtype)
    check_backward(f, x, gy, eps=eps, atol=atol, rtol=rtol)
    if dtype == numpy.float64:
        check_double_backward(f, x, gy, _randn((4, 5), 2), eps=1e-5,
                              atol=1e-6, rtol=1e-5)


def test_seedable_through_numpy_global_state():
    x = numpy.ones((8, 8), numpy.float32)
    numpy.random.seed(123)
    a = F.dropout(x).array
    numpy.random.seed(123)
    b = F.dropout(x).array
    numpy.random.seed(124)
    c = F.dropout(x).array
    numpy.testing.assert_array_equal(a, b)
    assert not numpy.array_equal(a, c)


def test_generator_rng():
    x = numpy.ones((50, 50))
    y = F.dropout(x, 0.25, rng=numpy.random.default_rng(0))
    assert abs((y.array == 0).mean() - 0.25) < 0.04


@pytest.mark.parametrize('ratio', [-0.1, 1.0, 1.5, '0.5', None])
def test_bad_ratio(ratio):
    with pytest.raises(ValueError, match=r'dropout: ratio must be .*\[0, 1\)'):
        F.dropout(_randn((2, 2)), ratio)


def test_bad_input_dtype():
    with pytest.raises(TypeError, match='dropout: x .*int64'):
        F.dropout(numpy.arange(4), 0.5)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32,
                                   numpy.float64])
def test_gpu_drops_and_backward_uses_mask(dtype):
    x = Variable(backend.to_gpu(numpy.ones((100, 100), dtype)))
    y = F.dropout(x, 0.3)
    assert y.dtype == dtype and backend.get_device_id(y.array) >= 0
    dropped = backend.to_cpu(y.array) == 0
    assert abs(dropped.mean() - 0.3) < 0.02
    y.grad = backend.to_gpu(numpy.ones((100, 100), dtype))
    y.backward()
    numpy.testing.assert_allclose(backend.to_cpu(x.grad),
                                  numpy.where(dropped, 0, 1 / 0.7), rtol=1e-3)
