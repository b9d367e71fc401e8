import numpy
import pytest

import minichain.functions as F
from minichain import Variable, backend
from minichain.gradient_check import check_backward, check_double_backward

TOL = {numpy.float64: (1e-5, 1e-6, 1e-5), numpy.float32: (1e-2, 5e-3, 1e-2)}


def _randn(shape, seed=0, dtype=numpy.float64):
    return numpy.asarray(numpy.random.RandomState(seed).randn(*shape), dtype)


def _np_linear(x, W, b=None, n_batch_axes=1):
    batch = x.shape[:n_batch_axes]
    x2 = x.reshape(int(numpy.prod(batch)), -1).astype(numpy.float64)
    y = numpy.einsum('ni,oi->no', x2, W.astype(numpy.float64))
    if b is not None:
        y = y + b
    return y.reshape(batch + (W.shape[0],))


# (x shape, n_batch_axes); W is (3, prod of the non-batch axes).
SHAPES = [((4, 5), 1), ((2, 2, 3), 1), ((2, 3, 4), 2), ((1, 2), 1)]


@pytest.mark.parametrize('x_shape,n_batch_axes', SHAPES)
@pytest.mark.parametrize('with_bias', [True, False])
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_forward(x_shape, n_batch_axes, with_bias, dtype):
    in_size = int(numpy.prod(x_shape[n_batch_axes:]))
    x, W = _randn(x_shape, 0, dtype), _randn((3, in_size), 1, dtype)
    b = _randn((3,), 2, dtype) if with_bias else None
    y = F.linear(Variable(x), Variable(W), None if b is None else Variable(b),
                 n_batch_axes=n_batch_axes)
    assert y.shape == x_shape[:n_batch_axes] + (3,) and y.dtype == dtype
    numpy.testing.assert_allclose(
        y.array, _np_linear(x, W, b, n_batch_axes),
        rtol=1e-6 if dtype == numpy.float64 else 1e-5, atol=1e-6)


@pytest.mark.parametrize('x_shape,n_batch_axes', SHAPES)
@pytest.mark.parametrize('with_bias', [True, False])
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_backward(x_shape, n_batch_axes, with_bias, dtype):
    eps, atol, rtol = TOL[dtype]
    in_size = int(numpy.prod(x_shape[n_batch_axes:]))
    inputs = (_randn(x_shape, 0, dtype), _randn((3, in_size), 1, dtype))
    if with_bias:
        inputs += (_randn((3,), 2, dtype),)
    gy = _randn(x_shape[:n_batch_axes] + (3,), 3, dtype)
    check_backward(lambda *v: F.linear(*v, n_batch_axes=n_batch_axes),
                   inputs, gy, eps=eps, atol=atol, rtol=rtol)


@pytest.mark.parametrize('with_bias', [True, False])
def test_double_backward(with_bias):
    inputs = (_randn((3, 4), 0), _randn((2, 4), 1))
    if with_bias:
        inputs += (_randn((2,), 2),)
    ggx = tuple(_randn(a.shape, 4 + i) for i, a in enumerate(inputs))
    check_double_backward(F.linear, inputs, _randn((3, 2), 3), ggx,
                          eps=1e-5, atol=1e-6, rtol=1e-5)


def test_only_requested_gradients():
    x = Variable(_randn((3, 4)), requires_grad=False)
    W = Variable(_randn((2, 4), 1))
    F.sum(F.linear(x, W)).backward()
    assert x.grad is None
    numpy.testing.assert_allclose(W.grad, numpy.tile(x.array.sum(0), (2, 1)))


def test_errors():
    x, W = _randn((4, 5)), _randn((3, 6))
    with pytest.raises(ValueError, match=r'linear: x of shape \(4, 5\) has '
                                         r'in_size 5 but W of shape \(3, 6\)'):
        F.linear(x, W)
    with pytest.raises(ValueError,
                       match=r'linear: W must be 2-D.*\(3, 5, 1\)'):
        F.linear(x, _randn((3, 5, 1)))
    with pytest.raises(ValueError, match=r'linear: b must have shape \(3,\).*'
                                         r'got \(4,\)'):
        F.linear(x, _randn((3, 5)), _randn((4,)))
    with pytest.raises(TypeError, match=r'linear: .*float64, float32'):
        F.linear(x, _randn((3, 5), 0, numpy.float32))
    with pytest.raises(TypeError, match=r'linear: x .*int64'):
        F.linear(numpy.ones((4, 5), numpy.int64), _randn((3, 5)))
    with pytest.raises(ValueError, match=r'linear: x of shape \(4, 5\) needs '
                                         r'more than n_batch_axes=2'):
        F.linear(x, _randn((3, 5)), n_batch_axes=2)
    with pytest.raises(ValueError, match=r'linear: n_batch_axes'):
        F.linear(x, _randn((3, 5)), n_batch_axes=0)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_gpu_matches_cpu():
    arrays = (_randn((2, 3, 2), 0, numpy.float32),
              _randn((4, 6), 1, numpy.float32), _randn((4,), 2, numpy.float32))
    results = []
    for to in (lambda a: a, backend.to_gpu):
        vs = [Variable(to(a)) for a in arrays]
        y = F.linear(*vs)
        F.sum(y * y).backward()
        results.append([backend.to_cpu(y.array)] +
                       [backend.to_cpu(v.grad) for v in vs])
    for cpu, gpu in zip(*results):
        numpy.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=1e-5)
