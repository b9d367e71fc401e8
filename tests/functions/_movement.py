"""Checks shared by the tests of ops that only move elements around
(``array.py``, ``join.py``).

A case is ``(call, reference, shapes)``: the minichain call taking its
inputs positionally, the NumPy expression it must equal, and the input
shapes. ``TestX = tests_for(CASES)`` in a test module checks every case.
"""
import numpy
import pytest

import minichain.functions as F
from minichain import Variable
from tests.functions._util import DTYPES, double_grad_check, grad_check, rand


def inputs(case, dtype, seed):
    """Random inputs of the case's shapes."""
    return tuple(rand(s, dtype, seed=seed + i)
                 for i, s in enumerate(case[2]))


def as_tuple(y):
    return y if isinstance(y, tuple) else (y,)


def check_forward(case, dtype):
    """The outputs are Variables equal to the NumPy reference."""
    func, ref, _ = case
    xs = inputs(case, dtype, 0)
    ys = as_tuple(func(*[Variable(x) for x in xs]))
    expected = as_tuple(ref(*xs))
    assert len(ys) == len(expected)
    for y, e in zip(ys, expected):
        assert isinstance(y, Variable)
        assert y.shape == e.shape and y.dtype == dtype
        numpy.testing.assert_array_equal(y.array, e)


def check_gradient_is_the_moved_gradient(case):
    """The gradient of a pure data movement is the transposed movement:
    run NumPy's reference on arrays of element ids and scatter each output
    gradient back to the ids it came from (an independent reference)."""
    func, ref, shapes = case
    sizes = [int(numpy.prod(s)) for s in shapes]
    offsets = numpy.cumsum([0] + sizes)
    ids = [numpy.arange(o, o + n, dtype=numpy.float64).reshape(s)
           for o, n, s in zip(offsets, sizes, shapes)]
    vs = [Variable(x) for x in inputs(case, numpy.float64, 3)]
    ys = as_tuple(func(*vs))
    flat_grad = numpy.zeros(offsets[-1])
    total = 0
    for k, (y, y_ids) in enumerate(zip(ys, as_tuple(ref(*ids)))):
        gy = rand(y.shape, numpy.float64, seed=10 + k)
        total = total + F.sum(y * gy)
        numpy.add.at(flat_grad, y_ids.astype(int).ravel(), gy.ravel())
    total.backward()
    for v, o, n in zip(vs, offsets, sizes):
        numpy.testing.assert_allclose(v.grad.ravel(), flat_grad[o:o + n],
                                      rtol=1e-6)


def tests_for(cases):
    """A test class running the forward, backward and double-backward
    checks on every case in ``cases`` (a dict name -> case), for each
    dtype; bind it to a ``Test*`` name in the test module."""
    @pytest.mark.parametrize('dtype', DTYPES)
    @pytest.mark.parametrize('name', sorted(cases))
    class Checks:
        def test_forward(self, name, dtype):
            check_forward(cases[name], dtype)

        def test_backward(self, name, dtype):
            grad_check(cases[name][0], inputs(cases[name], dtype, 1), dtype)

        def test_double_backward(self, name, dtype):
            double_grad_check(cases[name][0], inputs(cases[name], dtype, 2),
                              dtype)
    return Checks
