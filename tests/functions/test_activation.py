import numpy
import pytest

import minichain
import minichain.functions as F
from minichain import Variable, backend
from minichain.gradient_check import check_backward, check_double_backward

# (eps, atol, rtol) for the gradient checks of each dtype.
TOL = {numpy.float64: (1e-5, 1e-6, 1e-5), numpy.float32: (1e-2, 1e-2, 1e-2)}
FWD_RTOL = {numpy.float64: 1e-6, numpy.float32: 1e-5}


def _off_kink(shape, seed=0, dtype=numpy.float64):
    """Values in +-[0.1, 1]: far enough from 0 that +-eps never crosses it."""
    rng = numpy.random.RandomState(seed)
    mag = rng.uniform(0.1, 1.0, shape)
    return (mag * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def _randn(shape, seed=0, dtype=numpy.float64):
    return numpy.random.RandomState(seed).randn(*shape).astype(dtype)


def _np_softmax(x, axis):
    e = numpy.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


REFERENCES = {
    'relu': (F.relu, lambda x: numpy.where(x > 0, x, 0)),
    'leaky_relu': (F.leaky_relu, lambda x: numpy.where(x > 0, x, 0.2 * x)),
    'sigmoid': (F.sigmoid, lambda x: 1 / (1 + numpy.exp(-x))),
    'tanh': (F.tanh, numpy.tanh),
    'softmax': (F.softmax, lambda x: _np_softmax(x, 1)),
    'log_softmax': (F.log_softmax, lambda x: numpy.log(_np_softmax(x, 1))),
}
SMOOTH = ['sigmoid', 'tanh', 'softmax', 'log_softmax']


@pytest.mark.parametrize('name', sorted(REFERENCES))
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_forward_matches_numpy(name, dtype):
    func, ref = REFERENCES[name]
    x = _off_kink((4, 5), dtype=dtype) * 3
    y = func(Variable(x))
    assert y.shape == x.shape and y.dtype == dtype
    numpy.testing.assert_allclose(y.array, ref(x.astype(numpy.float64)),
                                  rtol=FWD_RTOL[dtype], atol=1e-7)


@pytest.mark.parametrize('name', sorted(REFERENCES))
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_backward(name, dtype):
    func = REFERENCES[name][0]
    eps, atol, rtol = TOL[dtype]
    x = _off_kink((3, 4), dtype=dtype)
    gy = _randn((3, 4), seed=1, dtype=dtype)
    check_backward(func, x, gy, eps=eps, atol=atol, rtol=rtol)


@pytest.mark.parametrize('name', sorted(REFERENCES))
def test_double_backward(name):
    func = REFERENCES[name][0]
    x = _off_kink((2, 3))
    gy = _randn((2, 3), seed=1)
    ggx = _randn((2, 3), seed=2)
    check_double_backward(func, x, gy, ggx, eps=1e-5, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize('axis', [0, 1, -1, 2])
def test_softmax_axes_forward_and_backward(axis):
    x = _randn((2, 3, 4))
    for func, ref in ((F.softmax, lambda a: _np_softmax(a, axis)),
                      (F.log_softmax,
                       lambda a: numpy.log(_np_softmax(a, axis)))):
        numpy.testing.assert_allclose(func(x, axis=axis).array, ref(x),
                                      rtol=1e-6)
        check_backward(lambda v: func(v, axis=axis), x, _randn(x.shape, 1),
                       eps=1e-5, atol=1e-6, rtol=1e-5)


def test_softmax_is_numerically_stable():
    x = numpy.array([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]])
    y = F.softmax(x).array
    log_y = F.log_softmax(x).array
    assert numpy.all(numpy.isfinite(y)) and numpy.all(numpy.isfinite(log_y))
    numpy.testing.assert_allclose(y, _np_softmax(x - x.max(1, keepdims=True),
                                                 1), rtol=1e-12)
    # log_softmax keeps tiny probabilities that log(softmax) would lose.
    x = numpy.array([[0.0, -800.0]])
    numpy.testing.assert_allclose(F.log_softmax(x).array, [[0.0, -800.0]])


def test_leaky_relu_slopes():
    x = _off_kink((3, 4))
    for slope in (0.0, 0.5, -0.3):
        y = F.leaky_relu(x, slope=slope)
        numpy.testing.assert_allclose(y.array,
                                      numpy.where(x > 0, x, slope * x))
        check_backward(lambda v: F.leaky_relu(v, slope), x, _randn(x.shape, 1),
                       eps=1e-5, atol=1e-6, rtol=1e-5)
        check_double_backward(lambda v: F.leaky_relu(v, slope), x,
                              _randn(x.shape, 1), _randn(x.shape, 2),
                              eps=1e-5, atol=1e-6, rtol=1e-5)


def test_relu_keeps_only_its_output():
    x = Variable(_off_kink((3, 4)))
    y = F.relu(x)
    node = y.creator
    assert node._input_indexes_to_retain is None
    assert node._output_indexes_to_retain == (0,)
    y.grad = numpy.ones_like(y.array)
    y.backward()
    numpy.testing.assert_array_equal(x.grad, (x.array > 0).astype(x.dtype))


def test_relu_grad_after_output_dropped():
    # backward must work when the user no longer holds the relu output.
    x = Variable(_off_kink((3, 4)))
    loss = F.sum(F.relu(x) * 2.0)
    loss.backward()
    numpy.testing.assert_array_equal(x.grad, 2.0 * (x.array > 0))


def test_sigmoid_extreme_inputs():
    x = numpy.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=numpy.float32)
    y = F.sigmoid(x).array
    assert numpy.all(numpy.isfinite(y))
    numpy.testing.assert_allclose(y, [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-6)


def test_identity():
    a = Variable(_randn((2, 3)))
    b = Variable(_randn((4,), 1))
    y = F.identity(a)
    assert isinstance(y, Variable) and y is not a and y.creator is not None
    numpy.testing.assert_array_equal(y.array, a.array)
    ya, yb = F.identity(a, b)
    numpy.testing.assert_array_equal(yb.array, b.array)
    loss = F.sum(ya * 3.0) + F.sum(yb)
    loss.backward()
    numpy.testing.assert_array_equal(a.grad, numpy.full((2, 3), 3.0))
    numpy.testing.assert_array_equal(b.grad, numpy.ones(4))
    # identity's outputs alias its inputs, and numerical_grad perturbs the
    # inputs in place, so copy the outputs (a product by 1) before comparing.
    check_backward(lambda u, v: tuple(y * 1.0 for y in F.identity(u, v)),
                   (a.array, b.array),
                   (_randn((2, 3), 2), _randn((4,), 3)), eps=1e-5, atol=1e-6,
                   rtol=1e-5)


def test_no_graph_in_no_backprop_mode():
    with minichain.no_backprop_mode():
        y = F.relu(Variable(_off_kink((2, 2))))
    assert y.creator is None


@pytest.mark.parametrize('name', sorted(REFERENCES))
def test_integer_input_raises_type_error(name):
    func = REFERENCES[name][0]
    with pytest.raises(TypeError, match=name + r'.*int64'):
        func(numpy.arange(6).reshape(2, 3))


def test_non_array_and_bad_args_raise():
    with pytest.raises(TypeError, match='relu'):
        F.relu([1.0, 2.0])
    with pytest.raises(ValueError, match=r'softmax: axis 2 .* 2 dimensions'):
        F.softmax(_randn((2, 3)), axis=2)
    with pytest.raises(ValueError, match=r'log_softmax.*shape \(\)'):
        F.log_softmax(numpy.ones(()))
    with pytest.raises(TypeError, match='softmax: axis must be an int'):
        F.softmax(_randn((2, 3)), axis=(0, 1))
    with pytest.raises(TypeError, match='leaky_relu: slope'):
        F.leaky_relu(_randn((2, 3)), slope='0.2')
    with pytest.raises(ValueError, match='identity'):
        F.identity()
    with pytest.raises(TypeError, match='identity: input 1'):
        F.identity(_randn((2,)), 3.0)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('name', sorted(REFERENCES))
def test_gpu_matches_cpu(name):
    func = REFERENCES[name][0]
    x, gy = _off_kink((3, 4), dtype=numpy.float32), _randn((3, 4), 1)
    results = []
    for to in (lambda a: a, backend.to_gpu):
        v = Variable(to(x))
        y = func(v)
        y.grad = to(gy.astype(numpy.float32))
        y.backward()
        results.append((backend.to_cpu(y.array), backend.to_cpu(v.grad)))
    for cpu, gpu in zip(*results):
        numpy.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=1e-6)
