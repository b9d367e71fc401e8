"""Tests for minichain/functions/reduction.py: sum, mean, max, min and
logsumexp."""
import numpy
import pytest

import minichain.functions as F
from minichain import Variable
from tests.functions._util import (DTYPES, distinct, double_grad_check,
                                   grad_check, rand)

SHAPE = (2, 3, 4)
AXES = [None, 0, -1, (0, 2), (0, 1, 2)]


def _np_logsumexp(x, axis):
    # Independent reference: float64 with the max subtracted by hand.
    m = numpy.max(x, axis=axis, keepdims=True)
    return numpy.squeeze(numpy.log(numpy.sum(numpy.exp(x - m), axis=axis,
                                             keepdims=True)) + m, axis=axis)


# name -> (function, NumPy reference, takes keepdims, smooth)
REDUCTIONS = {
    'sum': (F.sum, numpy.sum, True, True),
    'mean': (F.mean, numpy.mean, True, True),
    'max': (F.max, numpy.max, True, False),
    'min': (F.min, numpy.min, True, False),
    'logsumexp': (F.logsumexp, _np_logsumexp, False, True),
}


def _call(name, x, axis, keepdims):
    func, _, has_keepdims, _ = REDUCTIONS[name]
    if has_keepdims:
        return func(x, axis=axis, keepdims=keepdims)
    return func(x, axis=axis)


def _ref(name, x, axis, keepdims):
    ref, has_keepdims = REDUCTIONS[name][1], REDUCTIONS[name][2]
    if has_keepdims:
        return ref(x, axis=axis, keepdims=keepdims)
    return ref(x, axis=axis)


def _input(dtype, seed):
    # Distinct values so that max/min have a unique winner everywhere.
    return distinct(SHAPE, dtype, gap=0.1, seed=seed)


CASES = [(name, axis, keepdims) for name in sorted(REDUCTIONS)
         for axis in AXES for keepdims in (False, True)
         if keepdims is False or REDUCTIONS[name][2]]


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name,axis,keepdims', CASES)
class TestReduction:
    def test_forward(self, name, axis, keepdims, dtype):
        x = _input(dtype, 0)
        y = _call(name, Variable(x), axis, keepdims)
        expected = _ref(name, x.astype(numpy.float64), axis, keepdims)
        assert y.shape == numpy.shape(expected)
        assert y.dtype == dtype
        numpy.testing.assert_allclose(y.array, expected, rtol=1e-6)

    def test_backward(self, name, axis, keepdims, dtype):
        grad_check(lambda x: _call(name, x, axis, keepdims),
                   (_input(dtype, 1),), dtype)

    def test_double_backward(self, name, axis, keepdims, dtype):
        # max/min have a zero second derivative off ties; the check still
        # exercises the gy path of their backward.
        double_grad_check(lambda x: _call(name, x, axis, keepdims),
                          (_input(dtype, 2),), dtype)


def _np_grad(name, x, axis, gy):
    """Independent NumPy gradient of each reduction (keepdims=False)."""
    gy = numpy.expand_dims(gy, axis) if axis is not None else gy
    if name == 'sum':
        return numpy.broadcast_to(gy, x.shape)
    if name == 'mean':
        n = x.size if axis is None else x.shape[axis]
        return numpy.broadcast_to(gy / n, x.shape)
    if name in ('max', 'min'):
        best = getattr(numpy, name)(x, axis=axis, keepdims=True)
        return numpy.where(x == best, gy, 0)
    soft = numpy.exp(x - numpy.max(x, axis=axis, keepdims=True))
    soft /= soft.sum(axis=axis, keepdims=True)
    return gy * soft


@pytest.mark.parametrize('name', sorted(REDUCTIONS))
@pytest.mark.parametrize('axis', [None, 1])
def test_matches_numpy_float64(name, axis):
    """Forward and analytic gradient against independent NumPy code."""
    x = rand(SHAPE, numpy.float64, -2, 2, seed=5)
    v = Variable(x)
    y = _call(name, v, axis, False)
    gy = rand(y.shape, numpy.float64, seed=6)
    y.grad = gy
    y.backward()
    numpy.testing.assert_allclose(y.array, _ref(name, x, axis, False),
                                  rtol=1e-6)
    numpy.testing.assert_allclose(v.grad, _np_grad(name, x, axis, gy),
                                  rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize('dtype', DTYPES)
def test_logsumexp_is_stable(dtype):
    x = numpy.array([[1000, 1000, 999], [-1000, -1001, -1000]], dtype)
    y = F.logsumexp(Variable(x), axis=1)
    expected = _np_logsumexp(x.astype(numpy.float64), 1)
    numpy.testing.assert_allclose(y.array, expected, rtol=1e-6)
    v = Variable(x)
    F.sum(F.logsumexp(v, axis=1)).backward()
    assert numpy.all(numpy.isfinite(v.grad))
    numpy.testing.assert_allclose(v.grad.sum(axis=1), [1, 1], rtol=1e-5)


def test_logsumexp_of_all_minus_inf_is_minus_inf():
    x = numpy.full((2, 3), -numpy.inf)
    with numpy.errstate(divide='ignore'):
        y = F.logsumexp(x, axis=1)
    numpy.testing.assert_array_equal(y.array, [-numpy.inf, -numpy.inf])


def test_scalar_input():
    x = numpy.array(1.5)
    for name in REDUCTIONS:
        y = _call(name, Variable(x), None, False)
        assert y.shape == ()
        numpy.testing.assert_allclose(y.array, 1.5)


def test_max_ties_share_gradient():
    # Chainer's rule: every element equal to the maximum gets the gradient.
    v = Variable(numpy.array([1.0, 3.0, 3.0]))
    F.max(v).backward()
    numpy.testing.assert_array_equal(v.grad, [0, 1, 1])


def test_sum_accepts_integers_mean_does_not():
    assert F.sum(numpy.arange(4)).array == 6
    with pytest.raises(TypeError, match='mean: .*int64'):
        F.mean(numpy.arange(4))
    with pytest.raises(TypeError, match='logsumexp: .*int64'):
        F.logsumexp(numpy.arange(4))


@pytest.mark.parametrize('name', sorted(REDUCTIONS))
def test_bad_axis(name):
    x = numpy.zeros((2, 3))
    with pytest.raises(ValueError, match='{}: axis 2 is out of range.* 2 '
                       'dimensions'.format(name)):
        _call(name, x, 2, False)
    with pytest.raises(ValueError, match='{}: repeated axis'.format(name)):
        _call(name, x, (1, -1), False)


@pytest.mark.parametrize('name', ['mean', 'max', 'min', 'logsumexp'])
def test_empty_reduction(name):
    with pytest.raises(ValueError, match=r'{}: .*empty.*\(2, 0\)'
                       .format(name)):
        _call(name, numpy.zeros((2, 0)), 1, False)


# F.average against Chainer v7.8.1's own test of it (test_average.py):
# numpy.average is the reference, weights of x's shape for axis None and of
# x.shape[axis] for one axis, no weights with a tuple axis, a () input too.
AVERAGE_CASES = [((3, 2, 4), axis, weighted, keepdims)
                 for axis in (None, 0, 1, 2, -1, (0, 1), (1, -1))
                 for weighted in (False, True) for keepdims in (False, True)
                 if not (weighted and isinstance(axis, tuple))] + [
    ((), None, weighted, keepdims) for weighted in (False, True)
    for keepdims in (False, True)]


def _weights(shape, axis, dtype):
    w_shape = shape if axis is None else (shape[axis],)
    w = rand(w_shape, dtype, -2, 2, seed=1)
    w.flat[0] += 3 if w.sum() >= 0 else -3  # far from summing to 0
    return w


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shape,axis,weighted,keepdims', AVERAGE_CASES)
def test_average_is_numpy_average(shape, axis, weighted, keepdims, dtype):
    x = rand(shape, dtype)
    w = _weights(shape, axis, dtype) if weighted else None
    y = F.average(x, axis=axis, weights=w, keepdims=keepdims)
    want = numpy.average(x.astype(numpy.float64), axis=axis, weights=w)
    if keepdims:  # numpy.average has no keepdims
        want = want.reshape(numpy.mean(x, axis=axis, keepdims=True).shape)
    assert y.shape == numpy.shape(want) and y.dtype == dtype
    numpy.testing.assert_allclose(y.array, want, rtol=1e-5)
    inputs = (x,) if w is None else (x, w)
    grad_check(lambda *v: F.average(v[0], axis, *v[1:], keepdims=keepdims),
               inputs, dtype)


def test_average_refuses_what_chainer_does():
    x = numpy.zeros((3, 2))
    with pytest.raises(ValueError, match=r'average: axis \(0, 1\) has '
                       'several axes; with weights only None or one axis'):
        F.average(x, (0, 1), numpy.ones(6))
    with pytest.raises(ValueError, match=r'average: weights of shape \(3,\) '
                       r'for x of shape \(3, 2\) and axis \(1,\): expected '
                       r'shape \(2,\)'):
        F.average(x, 1, numpy.ones(3))
    with pytest.raises(TypeError, match='average: x .*int64'):
        F.average(numpy.arange(3), weights=numpy.ones(3))
    with pytest.raises(TypeError, match='average: inputs must share one '
                       'dtype, got float64, float32'):
        F.average(numpy.ones(3), weights=numpy.ones(3, numpy.float32))
