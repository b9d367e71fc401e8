"""Tests for minichain/functions/array.py (and _array_join.py, which it
re-exports): shape functions, forward vs NumPy, gradients and errors."""
import numpy
import pytest

import minichain.functions as F
from minichain import Variable
from tests.functions._util import (DTYPES, double_grad_check, grad_check,
                                   rand)

# name -> (minichain call, NumPy reference, input shapes)
# Every call takes its inputs positionally; hyper-parameters are bound here.
CASES = {
    'broadcast_to': (lambda x: F.broadcast_to(x, (2, 3, 4)),
                     lambda x: numpy.broadcast_to(x, (2, 3, 4)), [(3, 1)]),
    'sum_to': (lambda x: F.sum_to(x, (3, 1)),
               lambda x: x.sum(axis=(0, 2)).reshape(3, 1), [(2, 3, 4)]),
    'reshape': (lambda x: F.reshape(x, (4, -1)),
                lambda x: x.reshape(4, -1), [(2, 3, 2)]),
    'transpose': (lambda x: F.transpose(x, (1, 2, 0)),
                  lambda x: x.transpose(1, 2, 0), [(2, 3, 4)]),
    'transpose_default': (F.transpose, numpy.transpose, [(2, 3, 4)]),
    'get_item_slice': (lambda x: F.get_item(x, (slice(None), slice(1, 3))),
                       lambda x: x[:, 1:3], [(2, 4)]),
    'get_item_repeated': (lambda x: F.get_item(x, [0, 2, 0, 0]),
                          lambda x: x[[0, 2, 0, 0]], [(3, 2)]),
    'get_item_mask': (lambda x: F.get_item(x, numpy.array([True, False,
                                                           True])),
                      lambda x: x[[True, False, True]], [(3, 2)]),
    'expand_dims': (lambda x: F.expand_dims(x, -2),
                    lambda x: numpy.expand_dims(x, -2), [(2, 3)]),
    'flatten': (F.flatten, numpy.ravel, [(2, 3, 2)]),
    'squeeze': (F.squeeze, numpy.squeeze, [(1, 3, 1, 2)]),
    'squeeze_axis': (lambda x: F.squeeze(x, -2),
                     lambda x: numpy.squeeze(x, -2), [(1, 3, 1, 2)]),
    'concat': (lambda a, b, c: F.concat([a, b, c]),
               lambda a, b, c: numpy.concatenate([a, b, c], axis=1),
               [(2, 1, 2), (2, 3, 2), (2, 2, 2)]),
    'concat_axis0': (lambda a, b: F.concat((a, b), axis=0),
                     lambda a, b: numpy.concatenate([a, b]),
                     [(1, 3), (2, 3)]),
    'stack': (lambda a, b, c: F.stack([a, b, c]),
              lambda a, b, c: numpy.stack([a, b, c]), [(2, 3)] * 3),
    'stack_last': (lambda a, b: F.stack([a, b], axis=-1),
                   lambda a, b: numpy.stack([a, b], axis=-1), [(2, 3)] * 2),
    'split_sections': (lambda x: F.split_axis(x, 3, 1),
                       lambda x: tuple(numpy.split(x, 3, 1)), [(2, 6)]),
    'split_indices': (lambda x: F.split_axis(x, [1, 1, 3], -1),
                      lambda x: tuple(numpy.split(x, [1, 1, 3], -1)),
                      [(2, 4)]),
}


def _inputs(name, dtype, seed):
    return tuple(rand(s, dtype, seed=seed + i)
                 for i, s in enumerate(CASES[name][2]))


def _as_tuple(y):
    return y if isinstance(y, tuple) else (y,)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', sorted(CASES))
class TestArray:
    def test_forward(self, name, dtype):
        func, ref, _ = CASES[name]
        xs = _inputs(name, dtype, 0)
        ys = _as_tuple(func(*[Variable(x) for x in xs]))
        expected = _as_tuple(ref(*xs))
        assert len(ys) == len(expected)
        for y, e in zip(ys, expected):
            assert isinstance(y, Variable)
            assert y.shape == e.shape and y.dtype == dtype
            numpy.testing.assert_array_equal(y.array, e)

    def test_backward(self, name, dtype):
        grad_check(CASES[name][0], _inputs(name, dtype, 1), dtype)

    def test_double_backward(self, name, dtype):
        double_grad_check(CASES[name][0], _inputs(name, dtype, 2), dtype)


@pytest.mark.parametrize('name', sorted(set(CASES) - {'sum_to'}))
def test_gradient_matches_numpy_float64(name):
    """The gradient of a pure data movement is the transposed movement:
    run NumPy's reference on arrays of element ids and scatter each output
    gradient back to the ids it came from (an independent reference)."""
    func, ref, shapes = CASES[name]
    sizes = [int(numpy.prod(s)) for s in shapes]
    offsets = numpy.cumsum([0] + sizes)
    ids = [numpy.arange(o, o + n, dtype=numpy.float64).reshape(s)
           for o, n, s in zip(offsets, sizes, shapes)]
    xs = _inputs(name, numpy.float64, 3)
    vs = [Variable(x) for x in xs]
    ys = _as_tuple(func(*vs))
    flat_grad = numpy.zeros(offsets[-1])
    total = 0
    for k, (y, y_ids) in enumerate(zip(ys, _as_tuple(ref(*ids)))):
        gy = rand(y.shape, numpy.float64, seed=10 + k)
        total = total + F.sum(y * gy)
        numpy.add.at(flat_grad, y_ids.astype(int).ravel(), gy.ravel())
    total.backward()
    for v, o, n in zip(vs, offsets, sizes):
        numpy.testing.assert_allclose(v.grad.ravel(), flat_grad[o:o + n],
                                      rtol=1e-6)


def test_sum_to_matches_numpy_float64():
    a = rand((2, 3, 4), numpy.float64)
    v = Variable(a)
    y = F.sum_to(v, (3, 1))
    gy = rand((3, 1), numpy.float64, seed=1)
    y.grad = gy
    y.backward()
    numpy.testing.assert_allclose(y.array, a.sum(axis=(0, 2))[:, None],
                                  rtol=1e-6)
    numpy.testing.assert_allclose(v.grad, numpy.broadcast_to(gy, a.shape))


# -- indexing through the operator --------------------------------------------
def test_getitem_operator_and_repeated_indices():
    x = Variable(numpy.arange(6.0).reshape(3, 2))
    y = x[[0, 0, 2]]
    numpy.testing.assert_array_equal(y.array, [[0, 1], [0, 1], [4, 5]])
    F.sum(y).backward()
    numpy.testing.assert_array_equal(x.grad, [[2, 2], [0, 0], [1, 1]])


def test_getitem_variants():
    a = numpy.arange(24.0).reshape(2, 3, 4)
    x = Variable(a)
    for index in [1, (1, 2), (Ellipsis, 0), (slice(None), None, 1),
                  (0, [2, 0], slice(1, 3)), numpy.array([1, 1]), a > 10,
                  (Ellipsis, numpy.array([[0, 3], [3, 3]]))]:
        numpy.testing.assert_array_equal(x[index].array, a[index])


def test_getitem_advanced_gradient():
    grad_check(lambda x: x[numpy.array([[0, 1], [1, 1]]), 1:],
               (rand((2, 3), numpy.float64),), numpy.float64)


def test_getitem_errors():
    x = Variable(numpy.zeros((2, 3)))
    with pytest.raises(IndexError, match=r'get_item: .*\(2, 3\)'):
        x[5]
    with pytest.raises(IndexError, match='get_item'):
        x[0, 0, 0]


def test_transpose_methods():
    a = rand((2, 3, 4), numpy.float32)
    x = Variable(a)
    assert x.T.shape == (4, 3, 2)
    assert x.transpose(2, 0, 1).shape == (4, 2, 3)
    assert x.transpose((2, 0, 1)).shape == (4, 2, 3)
    assert x.reshape(6, 4).shape == (6, 4)
    assert x.reshape((4, 6)).shape == (4, 6)
    numpy.testing.assert_array_equal(x.T.array, a.T)


# -- split_axis: several outputs --------------------------------------------
def test_split_axis_returns_tuple_from_one_node():
    x = Variable(rand((2, 6), numpy.float32))
    ys = F.split_axis(x, 2, 1)
    assert isinstance(ys, tuple) and len(ys) == 2
    assert ys[0].creator is ys[1].creator
    assert F.split_axis(x, 1, 0)[0].shape == (2, 6)


def test_split_axis_missing_output_grads_are_zero():
    a = rand((2, 6), numpy.float64)
    x = Variable(a)
    ys = F.split_axis(x, [1, 4], 1)
    F.sum(ys[1] * 2).backward()  # ys[0] and ys[2] get no gradient
    expected = numpy.zeros_like(a)
    expected[:, 1:4] = 2
    numpy.testing.assert_array_equal(x.grad, expected)


def test_split_axis_partial_grads_double_backward():
    # Only the middle output reaches the loss; second order still checks.
    double_grad_check(lambda x: F.split_axis(x, [1, 3], 0)[1] ** 2,
                      (rand((4, 2), numpy.float64),), numpy.float64)


def test_split_concat_round_trip():
    a = rand((3, 5), numpy.float64)
    ys = F.split_axis(a, [2, 3], 1)
    numpy.testing.assert_array_equal(F.concat(ys, axis=1).array, a)


# -- errors ------------------------------------------------------------------
def test_concat_errors():
    with pytest.raises(ValueError, match=r'concat: shapes \(2, 3\), \(3, 3\)'
                       ' must agree except along axis 1'):
        F.concat([numpy.zeros((2, 3)), numpy.zeros((3, 3))])
    with pytest.raises(ValueError, match=r'concat: .*\(2, 3\), \(2,\)'):
        F.concat([numpy.zeros((2, 3)), numpy.zeros(2)], axis=0)
    with pytest.raises(ValueError, match=r'concat: axis 2 is out of range '
                       r'for shape \(2, 3\)'):
        F.concat([numpy.zeros((2, 3))] * 2, axis=2)
    with pytest.raises(TypeError, match='concat: .*float32, float64'):
        F.concat([numpy.zeros((2, 3), numpy.float32), numpy.zeros((2, 3))])
    with pytest.raises(TypeError, match='concat: xs must be a non-empty'):
        F.concat([])
    with pytest.raises(TypeError, match='concat: axis must be an int'):
        F.concat([numpy.zeros((2, 3))] * 2, axis=1.0)


def test_stack_errors():
    with pytest.raises(ValueError, match=r'stack: .*\(2, 3\), \(3, 2\)'):
        F.stack([numpy.zeros((2, 3)), numpy.zeros((3, 2))])
    with pytest.raises(ValueError, match=r'stack: axis 3 is out of range'):
        F.stack([numpy.zeros((2, 3))] * 2, axis=3)
    assert F.stack([numpy.zeros((2, 3))] * 2, axis=-3).shape == (2, 2, 3)


def test_split_axis_errors():
    x = numpy.zeros((2, 5))
    with pytest.raises(ValueError, match=r'split_axis: 2 sections do not '
                       r'divide axis 1 of shape \(2, 5\)'):
        F.split_axis(x, 2, 1)
    with pytest.raises(ValueError, match=r'split_axis: split points \[3, 1\]'):
        F.split_axis(x, [3, 1], 1)
    with pytest.raises(ValueError, match=r'split_axis: .*\[6\].*\[0, 5\]'):
        F.split_axis(x, [6], 1)
    with pytest.raises(ValueError, match=r'split_axis: axis -3 is out of '
                       r'range for shape \(2, 5\)'):
        F.split_axis(x, 1, -3)


def test_shape_function_errors():
    x = numpy.zeros((2, 3))
    with pytest.raises(ValueError, match=r'squeeze: axis 0 of shape \(2, 3\)'):
        F.squeeze(x, 0)
    with pytest.raises(ValueError, match='squeeze: axis 2 is out of range'):
        F.squeeze(x, 2)
    with pytest.raises(ValueError, match=r'transpose: axes \(0, 3\) .*'
                       r'\(2, 3\)'):
        F.transpose(x, (0, 3))
    with pytest.raises(ValueError, match=r'transpose: axes \(0, 0\)'):
        F.transpose(x, (0, 0))
    with pytest.raises(ValueError, match=r'reshape: .*\(2, 3\).*\(4, 2\)'):
        F.reshape(x, (4, 2))
    with pytest.raises(ValueError, match=r'broadcast_to: .*\(2, 3\) to '
                       r'\(3, 3\)'):
        F.broadcast_to(x, (3, 3))
    with pytest.raises(ValueError, match=r'sum_to: shape \(2,\) .*\(2, 3\)'):
        F.sum_to(x, (2,))
    with pytest.raises(ValueError, match=r'expand_dims: axis 3 .*\(2, 3\)'):
        F.expand_dims(x, 3)
    with pytest.raises(TypeError, match='flatten: x must be a Variable'):
        F.flatten([1, 2])


def test_flatten_of_scalar_and_identity_shapes():
    assert F.flatten(numpy.array(2.0)).shape == (1,)
    # Same-shape broadcast/sum_to/reshape still make a new node.
    x = Variable(rand((2, 3), numpy.float32))
    for y in (F.broadcast_to(x, (2, 3)), F.sum_to(x, (2, 3)),
              F.reshape(x, (2, 3))):
        assert y is not x and y.creator is not None
