"""Tests for minichain/functions/join.py: concat, stack and split_axis,
forward vs NumPy, gradients, several outputs and errors."""
import numpy
import pytest

import minichain.functions as F
from minichain import Variable
from tests.functions import _movement as movement
from tests.functions._util import double_grad_check, rand

# name -> (minichain call, NumPy reference, input shapes)
CASES = {
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


TestJoin = movement.tests_for(CASES)


@pytest.mark.parametrize('name', sorted(CASES))
def test_gradient_matches_numpy_float64(name):
    movement.check_gradient_is_the_moved_gradient(CASES[name])


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
