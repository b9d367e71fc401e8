"""Tests for minichain/functions/math.py: forward vs NumPy, gradients and
errors."""
import numpy
import pytest

import minichain.functions as F
from minichain import Variable
from tests.functions._util import (DTYPES, distinct, double_grad_check,
                                   grad_check, off_zero, rand)

SHAPE = (2, 3)

# name -> (function, NumPy forward, NumPy derivative, input maker)
UNARY = {
    'exp': (F.exp, numpy.exp, numpy.exp,
            lambda dt, s: rand(SHAPE, dt, -1, 1, s)),
    'log': (F.log, numpy.log, lambda x: 1 / x,
            lambda dt, s: rand(SHAPE, dt, 0.5, 2, s)),
    'sqrt': (F.sqrt, numpy.sqrt, lambda x: 0.5 / numpy.sqrt(x),
             lambda dt, s: rand(SHAPE, dt, 0.5, 2, s)),
    'square': (F.square, numpy.square, lambda x: 2 * x,
               lambda dt, s: rand(SHAPE, dt, -1, 1, s)),
    'absolute': (F.absolute, numpy.abs, numpy.sign,
                 lambda dt, s: off_zero(SHAPE, dt, 0.2, 1.5, s)),
}
SMOOTH = ['exp', 'log', 'sqrt', 'square']


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', sorted(UNARY))
class TestUnary:
    def test_forward(self, name, dtype):
        func, ref, _, make = UNARY[name]
        x = make(dtype, 0)
        y = func(Variable(x))
        assert y.shape == x.shape and y.dtype == dtype
        numpy.testing.assert_allclose(y.array, ref(x), rtol=1e-6)

    def test_backward(self, name, dtype):
        func, _, _, make = UNARY[name]
        grad_check(func, (make(dtype, 1),), dtype)

    def test_double_backward(self, name, dtype):
        # For absolute the second derivative is 0 off the kink; the check
        # still covers the gy path of its backward.
        func, _, _, make = UNARY[name]
        double_grad_check(func, (make(dtype, 2),), dtype)

    def test_rejects_integer_input(self, name, dtype):
        func = UNARY[name][0]
        with pytest.raises(TypeError, match='{}: .*int64'.format(name)):
            func(numpy.arange(3))


@pytest.mark.parametrize('name', sorted(UNARY))
def test_unary_matches_numpy_float64(name):
    """Forward and analytic gradient against independent NumPy formulas."""
    func, ref, deriv, make = UNARY[name]
    x = make(numpy.float64, 3)
    gy = rand(SHAPE, numpy.float64, seed=4)
    v = Variable(x)
    y = func(v)
    y.grad = gy
    y.backward()
    numpy.testing.assert_allclose(y.array, ref(x), rtol=1e-6)
    numpy.testing.assert_allclose(v.grad, gy * deriv(x), rtol=1e-6)


def test_grad_keeps_float32():
    x = Variable(rand(SHAPE, numpy.float32, 0.5, 2))
    F.sum(F.log(F.sqrt(F.exp(x)))).backward()
    assert x.grad.dtype == numpy.float32


def test_exp_log_inverse():
    x = rand(SHAPE, numpy.float64, 0.5, 2)
    numpy.testing.assert_allclose(F.log(F.exp(x)).array, x, rtol=1e-12)
    numpy.testing.assert_allclose(F.exp(F.log(x)).array, x, rtol=1e-12)


# -- maximum / minimum -----------------------------------------------------
BINARY = {'maximum': (F.maximum, numpy.maximum, numpy.greater),
          'minimum': (F.minimum, numpy.minimum, numpy.less)}


def _pair(dtype, shape1=SHAPE, shape2=SHAPE, seed=0):
    """Two arrays whose elements all differ by at least 0.1 (no ties)."""
    n1, n2 = int(numpy.prod(shape1)), int(numpy.prod(shape2))
    v = distinct((n1 + n2,), dtype, gap=0.1, seed=seed)
    return v[:n1].reshape(shape1), v[n1:].reshape(shape2)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', sorted(BINARY))
@pytest.mark.parametrize('shapes', [(SHAPE, SHAPE), ((2, 1), (1, 3)),
                                    (SHAPE, (3,))])
class TestBinary:
    def test_forward(self, name, dtype, shapes):
        func, ref, _ = BINARY[name]
        a, b = _pair(dtype, *shapes)
        y = func(Variable(a), Variable(b))
        assert y.dtype == dtype
        numpy.testing.assert_allclose(y.array, ref(a, b), rtol=1e-6)

    def test_backward(self, name, dtype, shapes):
        grad_check(BINARY[name][0], _pair(dtype, *shapes, seed=1), dtype)

    def test_double_backward(self, name, dtype, shapes):
        double_grad_check(BINARY[name][0], _pair(dtype, *shapes, seed=2),
                          dtype)


@pytest.mark.parametrize('name', sorted(BINARY))
def test_binary_matches_numpy_float64(name):
    func, ref, pick_first = BINARY[name]
    a, b = _pair(numpy.float64, seed=3)
    gy = rand(SHAPE, numpy.float64, seed=4)
    va, vb = Variable(a), Variable(b)
    y = func(va, vb)
    y.grad = gy
    y.backward()
    numpy.testing.assert_allclose(y.array, ref(a, b), rtol=1e-6)
    first = pick_first(a, b)
    numpy.testing.assert_allclose(va.grad, numpy.where(first, gy, 0))
    numpy.testing.assert_allclose(vb.grad, numpy.where(first, 0, gy))


def test_maximum_tie_goes_to_first():
    a, b = Variable(numpy.ones(3)), Variable(numpy.ones(3))
    F.sum(F.maximum(a, b)).backward()
    numpy.testing.assert_array_equal(a.grad, [1, 1, 1])
    numpy.testing.assert_array_equal(b.grad, [0, 0, 0])


@pytest.mark.parametrize('func', [F.maximum, F.minimum])
def test_binary_errors(func):
    name = func.__name__
    with pytest.raises(ValueError, match=r'{}: .*\(2, 3\).*\(4,\)'
                       .format(name)):
        func(numpy.zeros((2, 3)), numpy.zeros(4))
    with pytest.raises(TypeError, match='{}: .*float32.*float64'
                       .format(name)):
        func(numpy.zeros(3, numpy.float32), numpy.zeros(3))
    with pytest.raises(TypeError, match='{}: .*int64'.format(name)):
        func(numpy.arange(3), numpy.zeros(3))


# -- clip -------------------------------------------------------------------
def _clip_input(dtype, seed):
    # 12 values at +-0.05, +-0.15, ..., +-0.55: each 0.05 away from the
    # bounds used below (which sit on the 0.1 grid).
    return distinct((3, 4), dtype, gap=0.1, seed=seed)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('bounds', [(-0.3, 0.2), (None, 0.2), (-0.3, None)])
class TestClip:
    def test_forward(self, dtype, bounds):
        x = _clip_input(dtype, 0)
        y = F.clip(Variable(x), *bounds)
        assert y.dtype == dtype
        numpy.testing.assert_allclose(y.array, numpy.clip(x, *bounds))

    def test_backward(self, dtype, bounds):
        grad_check(lambda x: F.clip(x, *bounds), (_clip_input(dtype, 1),),
                   dtype)

    def test_double_backward(self, dtype, bounds):
        double_grad_check(lambda x: F.clip(x, *bounds),
                          (_clip_input(dtype, 2),), dtype)


def test_clip_matches_numpy_float64():
    x = _clip_input(numpy.float64, 3)
    gy = rand(x.shape, numpy.float64, seed=4)
    v = Variable(x)
    y = F.clip(v, -0.3, 0.2)
    y.grad = gy
    y.backward()
    numpy.testing.assert_allclose(y.array, numpy.clip(x, -0.3, 0.2),
                                  rtol=1e-6)
    inside = (x >= -0.3) & (x <= 0.2)
    assert 0 < inside.sum() < x.size
    numpy.testing.assert_allclose(v.grad, numpy.where(inside, gy, 0))


def test_clip_errors():
    x = numpy.zeros(3)
    with pytest.raises(ValueError, match='clip: .*both be None'):
        F.clip(x, None, None)
    with pytest.raises(ValueError, match=r'clip: x_min \(1\).*x_max \(0\)'):
        F.clip(x, 1, 0)
    with pytest.raises(TypeError, match='clip: x_min must be a scalar'):
        F.clip(x, numpy.zeros(3), 1)
    with pytest.raises(TypeError, match='clip: .*int64'):
        F.clip(numpy.arange(3), 0, 1)
