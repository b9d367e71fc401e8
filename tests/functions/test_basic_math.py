"""Tests for minichain/functions/basic_math.py: arithmetic, matmul and the
Variable operators."""
import re

import numpy
import pytest

import minichain.functions as F
from minichain import Variable
from tests.functions._util import (DTYPES, double_grad_check, grad_check,
                                   rand)

# name -> (function, NumPy reference, input maker(dtype, seed, shape1, shape2))
BINARY = {
    'add': (F.add, numpy.add),
    'sub': (F.sub, numpy.subtract),
    'mul': (F.mul, numpy.multiply),
    'div': (F.div, numpy.divide),
    'pow': (F.pow, numpy.power),
}
SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 1, 3), (4, 1)), ((), (2,))]


def _pair(name, dtype, seed, shapes):
    # div and pow want a second operand (and pow a base) away from 0.
    low = 0.5 if name in ('div', 'pow') else -1.0
    a = rand(shapes[0], dtype, 0.5 if name == 'pow' else -1.0, 1.5, seed)
    b = rand(shapes[1], dtype, low, 1.5, seed + 100)
    return a, b


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', sorted(BINARY))
@pytest.mark.parametrize('shapes', SHAPES)
class TestBinary:
    def test_forward(self, name, dtype, shapes):
        func, ref = BINARY[name]
        a, b = _pair(name, dtype, 0, shapes)
        y = func(Variable(a), Variable(b))
        expected = ref(a, b)
        assert y.shape == expected.shape and y.dtype == dtype
        numpy.testing.assert_allclose(y.array, expected, rtol=1e-6)

    def test_backward(self, name, dtype, shapes):
        grad_check(BINARY[name][0], _pair(name, dtype, 1, shapes), dtype)

    def test_double_backward(self, name, dtype, shapes):
        double_grad_check(BINARY[name][0], _pair(name, dtype, 2, shapes),
                          dtype)


@pytest.mark.parametrize('dtype', DTYPES)
class TestUnaryAndConstPow:
    def test_neg(self, dtype):
        x = rand((2, 3), dtype)
        y = F.neg(Variable(x))
        assert y.dtype == dtype
        numpy.testing.assert_array_equal(y.array, -x)
        grad_check(F.neg, (x,), dtype)
        double_grad_check(F.neg, (x,), dtype)

    @pytest.mark.parametrize('c', [2, 3, 0.5, -1.5, 0])
    def test_pow_constant(self, dtype, c):
        x = rand((2, 3), dtype, 0.5, 1.5)
        y = F.pow(Variable(x), c)
        assert y.dtype == dtype
        numpy.testing.assert_allclose(y.array, x ** c, rtol=1e-6)
        grad_check(lambda v: F.pow(v, c), (x,), dtype)
        double_grad_check(lambda v: F.pow(v, c), (x,), dtype)


def test_pow_constant_zero_has_zero_gradient_at_zero():
    x = Variable(numpy.zeros(3))
    F.sum(x ** 0).backward()
    numpy.testing.assert_array_equal(x.grad, [0, 0, 0])


# -- matmul --------------------------------------------------------------------
MATMUL_SHAPES = [((2, 3), (3, 4)), ((2, 2, 3), (2, 3, 4)), ((2, 3), (2, 3, 4)),
                 ((2, 1, 2, 3), (3, 3, 2)), ((3,), (3, 2)), ((2, 3), (3,)),
                 ((3,), (2, 3, 4)), ((2, 2, 3), (3,)), ((3,), (3,))]


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('shapes', MATMUL_SHAPES)
class TestMatMul:
    def test_forward(self, dtype, shapes):
        a, b = rand(shapes[0], dtype, seed=0), rand(shapes[1], dtype, seed=1)
        y = F.matmul(Variable(a), Variable(b))
        expected = a.astype(numpy.float64) @ b.astype(numpy.float64)
        assert y.shape == expected.shape and y.dtype == dtype
        numpy.testing.assert_allclose(y.array, expected, rtol=1e-5)

    def test_backward(self, dtype, shapes):
        a, b = rand(shapes[0], dtype, seed=2), rand(shapes[1], dtype, seed=3)
        grad_check(F.matmul, (a, b), dtype)

    def test_double_backward(self, dtype, shapes):
        a, b = rand(shapes[0], dtype, seed=4), rand(shapes[1], dtype, seed=5)
        double_grad_check(F.matmul, (a, b), dtype)


# -- agreement with independent NumPy code ---------------------------------
def _np_grads(name, a, b, gy):
    """Closed-form gradients of a op b (same shapes, no broadcasting)."""
    return {'add': lambda: (gy, gy), 'sub': lambda: (gy, -gy),
            'mul': lambda: (gy * b, gy * a),
            'div': lambda: (gy / b, -gy * a / b ** 2),
            'pow': lambda: (gy * b * a ** (b - 1),
                            gy * a ** b * numpy.log(a)),
            'matmul': lambda: (gy @ b.T, a.T @ gy)}[name]()


@pytest.mark.parametrize('name', sorted(BINARY) + ['matmul'])
def test_matches_numpy_float64(name):
    shapes = ((2, 3), (3, 4)) if name == 'matmul' else ((2, 3), (2, 3))
    a = rand(shapes[0], numpy.float64, 0.5, 1.5, seed=7)
    b = rand(shapes[1], numpy.float64, 0.5, 1.5, seed=8)
    func = F.matmul if name == 'matmul' else BINARY[name][0]
    ref = numpy.matmul if name == 'matmul' else BINARY[name][1]
    va, vb = Variable(a), Variable(b)
    y = func(va, vb)
    gy = rand(y.shape, numpy.float64, seed=9)
    y.grad = gy
    y.backward()
    numpy.testing.assert_allclose(y.array, ref(a, b), rtol=1e-6)
    ga, gb = _np_grads(name, a, b, gy)
    numpy.testing.assert_allclose(va.grad, ga, rtol=1e-6)
    numpy.testing.assert_allclose(vb.grad, gb, rtol=1e-6)


# -- operators -------------------------------------------------------------
@pytest.mark.parametrize('dtype', DTYPES)
def test_operators_between_variables(dtype):
    a, b = rand((2, 3), dtype, 0.5, 1.5, 0), rand((2, 3), dtype, 0.5, 1.5, 1)
    x, y = Variable(a), Variable(b)
    for result, expected in [(x + y, a + b), (x - y, a - b), (x * y, a * b),
                             (x / y, a / b), (x ** y, a ** b), (-x, -a),
                             (+x, a), (x @ y.T, a @ b.T)]:
        assert isinstance(result, Variable) and result.dtype == dtype
        numpy.testing.assert_allclose(result.array, expected, rtol=1e-6)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('const', [2, 2.5, numpy.float64(2.5),
                                   numpy.float32(2.5), numpy.int64(2)])
def test_operators_with_scalars_keep_dtype(dtype, const):
    a = rand((2, 3), dtype, 0.5, 1.5)
    x = Variable(a)
    c = dtype(const)
    cases = [(x + const, a + c), (const + x, c + a), (x - const, a - c),
             (const - x, c - a), (x * const, a * c), (const * x, c * a),
             (x / const, a / c), (const / x, c / a), (x ** const, a ** c),
             (const ** x, c ** a)]
    for result, expected in cases:
        assert isinstance(result, Variable)
        assert result.dtype == dtype, (const, result.dtype)
        numpy.testing.assert_allclose(result.array, expected, rtol=1e-6)


@pytest.mark.parametrize('dtype', DTYPES)
def test_operators_with_ndarray_on_either_side(dtype):
    a = rand((2, 3), dtype, 0.5, 1.5)
    # A float64 constant array is cast to the Variable's dtype (as Chainer).
    c = rand((2, 3), numpy.float64, 0.5, 1.5, seed=1)
    cc = c.astype(dtype)
    x = Variable(a)
    cases = [(c + x, cc + a), (c - x, cc - a), (c * x, cc * a),
             (c / x, cc / a), (c ** x, cc ** a), (x * c, a * cc),
             (c @ x.T, cc @ a.T), (x @ c.T, a @ cc.T)]
    for result, expected in cases:
        assert isinstance(result, Variable)
        assert result.dtype == dtype
        numpy.testing.assert_allclose(result.array, expected, rtol=1e-6)


def test_reflected_ops_gradients():
    a = rand((2, 3), numpy.float64, 0.5, 1.5)
    c = rand((2, 3), numpy.float64, 0.5, 1.5, seed=1)
    for f, df in [(lambda x: 2 - x, lambda x: -numpy.ones_like(x)),
                  (lambda x: 2 / x, lambda x: -2 / x ** 2),
                  (lambda x: 2 ** x, lambda x: numpy.log(2) * 2 ** x),
                  (lambda x: c * x, lambda x: c),
                  (lambda x: numpy.float64(3) * x ** 2, lambda x: 6 * x)]:
        x = Variable(a)
        F.sum(f(x)).backward()
        numpy.testing.assert_allclose(x.grad, df(a), rtol=1e-6)


def test_float32_stays_float32_through_backward():
    x = Variable(rand((2, 3), numpy.float32, 0.5, 1.5))
    y = F.sum((2 * x + 1) / 3 - x ** 2 + numpy.ones((2, 3)) * x)
    assert y.dtype == numpy.float32
    y.backward()
    assert x.grad.dtype == numpy.float32


def test_operator_with_unsupported_type_raises():
    x = Variable(numpy.zeros(3))
    with pytest.raises(TypeError):
        x + 'a'
    with pytest.raises(TypeError):
        [1, 2, 3] * x


# -- indexing ------------------------------------------------------------------
def test_indexing_with_repeated_integer_indices():
    x = Variable(numpy.arange(4.0))
    y = x[[1, 1, 3, 1]]
    numpy.testing.assert_array_equal(y.array, [1, 1, 3, 1])
    F.sum(y * numpy.array([1.0, 2.0, 3.0, 4.0])).backward()
    numpy.testing.assert_array_equal(x.grad, [0, 7, 0, 3])


@pytest.mark.parametrize('dtype', DTYPES)
def test_indexing_gradients(dtype):
    a = rand((3, 4), dtype)
    for index in [1, (slice(None), 2), (Ellipsis, slice(1, None, 2)),
                  [2, 0, 2], (numpy.array([0, 0]), numpy.array([1, 1]))]:
        grad_check(lambda x: x[index], (a,), dtype)
        y = Variable(a)[index]
        assert y.dtype == dtype
        numpy.testing.assert_array_equal(y.array, a[index])


# -- errors --------------------------------------------------------------------
def test_matmul_shape_error_names_both_shapes():
    a, b = Variable(numpy.zeros((2, 3))), Variable(numpy.zeros((4, 5)))
    with pytest.raises(ValueError, match=r'matmul: .*\(2, 3\).*\(4, 5\)'):
        F.matmul(a, b)
    with pytest.raises(ValueError, match=r'matmul: .*\(2, 3\).*\(4, 5\)'):
        a @ b


def test_matmul_other_errors():
    with pytest.raises(ValueError, match=r'matmul: batch axes of '
                       r'\(2, 2, 3\) and \(3, 3, 4\)'):
        F.matmul(numpy.zeros((2, 2, 3)), numpy.zeros((3, 3, 4)))
    with pytest.raises(ValueError, match=r'matmul: .*\(\) and \(3,\)'):
        F.matmul(numpy.zeros(()), numpy.zeros(3))
    with pytest.raises(TypeError, match='matmul: .*float32 and float64'):
        F.matmul(numpy.zeros((2, 3), numpy.float32), numpy.zeros((3, 2)))
    with pytest.raises(TypeError, match='matmul: b must be a Variable'):
        F.matmul(numpy.zeros((2, 3)), [[1.0], [2.0], [3.0]])


@pytest.mark.parametrize('name', sorted(BINARY))
def test_binary_errors(name):
    func = BINARY[name][0]
    with pytest.raises(ValueError, match=r'{}: shapes \(2, 3\) and \(4,\) '
                       'cannot be broadcast'.format(name)):
        func(numpy.ones((2, 3)), numpy.ones(4))
    with pytest.raises(TypeError, match='{}: .*float32, float64'
                       .format(name)):
        func(Variable(numpy.ones(3, numpy.float32)), Variable(numpy.ones(3)))
    with pytest.raises(TypeError, match='{}: second operand must be a '
                       'Variable or ndarray'.format(name)):
        func(numpy.ones(3), 'x')
    with pytest.raises(ValueError, match=r'{}: shapes \(2, 3\) and \(4,\)'
                       .format(name)):
        getattr(Variable(numpy.ones((2, 3))), {
            'add': '__add__', 'sub': '__sub__', 'mul': '__mul__',
            'div': '__truediv__', 'pow': '__pow__'}[name])(numpy.ones(4))


def test_neg_rejects_non_array():
    with pytest.raises(TypeError, match='neg: x must be a Variable'):
        F.neg([1.0])


@pytest.mark.parametrize('apply, shown', [
    (lambda v: v * 0.5, 'mul: the constant 0.5'),
    (lambda v: v + 0.7, 'add: the constant 0.7'),
    (lambda v: 0.5 * v, 'mul: the constant 0.5'),
    (lambda v: 1.5 - v, 'sub: the constant 1.5'),
    (lambda v: v / 2.5, 'div: the constant 2.5'),
    (lambda v: v ** 0.5, 'pow: the constant 0.5'),
    (lambda v: v * numpy.array([0.5, 1, 1]), 'mul: an array of float64'),
    (lambda v: v + 2 ** 40, 'add: the constant 1099511627776'),
])
def test_integer_variables_refuse_constants_the_cast_would_change(apply,
                                                                  shown):
    # Cast to int32, 0.5 was 0: v * 0.5 gave [0, 0, 0] and v + 0.7 gave v.
    v = Variable(numpy.array([1, 2, 3], numpy.int32))
    with pytest.raises(TypeError, match=re.escape(
            shown + " would change in the Variable's dtype int32")):
        apply(v)


def test_integer_variables_take_exact_constants():
    v = Variable(numpy.array([1, 2, 3], numpy.int32))
    for y, want in ((v * 2, [2, 4, 6]), (v + numpy.int64(1), [2, 3, 4]),
                    (v ** 2, [1, 4, 9]), (3 - v, [2, 1, 0]),
                    (v * numpy.array([1.0, 2.0, 0.0]), [1, 4, 0])):
        assert y.dtype == numpy.int32
        numpy.testing.assert_array_equal(y.array, want)
    x = Variable(numpy.array([1, 2], numpy.float32))  # floats round, as ever
    assert (x * 0.1).dtype == numpy.float32
