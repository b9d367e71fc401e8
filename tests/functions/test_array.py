"""Tests for minichain/functions/array.py: shape functions, forward vs NumPy,
gradients and errors."""
import numpy
import pytest

import minichain
import minichain.functions as F
from minichain import Variable
from tests.functions import _movement as movement
from minichain.gradient_check import check_backward
from tests.functions._util import grad_check, rand

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
}


TestArray = movement.tests_for(CASES)


@pytest.mark.parametrize('name', sorted(set(CASES) - {'sum_to'}))
def test_gradient_matches_numpy_float64(name):
    movement.check_gradient_is_the_moved_gradient(CASES[name])


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


# -- errors ------------------------------------------------------------------
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


# -- cast ---------------------------------------------------------------------
@pytest.mark.parametrize('to', ['float32', 'float16', 'bfloat16'])
def test_cast_and_its_gradient(to):
    if to == 'bfloat16':
        to = pytest.importorskip('ml_dtypes').bfloat16
    x = numpy.random.default_rng(0).standard_normal((3, 4))
    v = minichain.Variable(x)
    y = F.cast(v, to)
    assert y.dtype == numpy.dtype(to)
    numpy.testing.assert_array_equal(y.array, x.astype(to))
    y.grad = numpy.ones((3, 4), to) * numpy.dtype(to).type(0.5)
    y.backward()
    assert v.grad.dtype == numpy.float64            # back in x's dtype
    numpy.testing.assert_array_equal(v.grad, numpy.full((3, 4), 0.5))
    check_backward(lambda a: F.cast(a, numpy.float64),
                   x.astype(numpy.float32), numpy.ones((3, 4)), atol=1e-6)


def test_cast_to_its_own_dtype_is_the_variable_and_bad_dtypes_are_refused():
    v = minichain.Variable(numpy.ones(2, numpy.float32))
    assert F.cast(v, numpy.float32) is v
    with pytest.raises(TypeError, match='cast: dtype must be floating '
                       'point, got int32'):
        F.cast(v, numpy.int32)
    with pytest.raises(TypeError, match='cast: x must be floating point'):
        F.cast(numpy.ones(2, numpy.int32), numpy.float32)
