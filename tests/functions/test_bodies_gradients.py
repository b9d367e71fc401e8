"""Float64 gradient checks on the ops' bodies, with every kernel off.

The kernels are held to the bodies by test_kernels_equal_bodies.py; here
the bodies themselves (``config.use_kernels = False``) pass the numerical
gradient checks, first and second order, for every op that has a kernel.
"""
import numpy
import pytest

import minichain
from minichain import functions as F
from tests.functions._util import (distinct, double_grad_check, grad_check,
                                   off_zero, rand)

F64 = numpy.float64


@pytest.fixture(autouse=True)
def bodies_only():
    with minichain.using_config('use_kernels', False):
        yield


def _bn(x, gamma, beta, residual=None):
    return F.batch_normalization(x, gamma, beta, residual=residual,
                                 relu=True)


CASES = {
    'relu': (F.relu, [off_zero((3, 4), F64)]),
    'add': (F.add, [rand((3, 4), F64), rand((3, 4), F64, seed=1)]),
    'matmul': (F.matmul, [rand((3, 4), F64), rand((4, 2), F64, seed=1)]),
    'linear': (F.linear, [rand((3, 4), F64), rand((2, 4), F64, seed=1),
                          rand((2,), F64, seed=2)]),
    'convolution_3x3': (
        lambda x, W, b: F.convolution_2d(x, W, b, stride=2, pad=1),
        [rand((2, 3, 5, 5), F64), rand((4, 3, 3, 3), F64, seed=1),
         rand((4,), F64, seed=2)]),
    'convolution_groups': (
        lambda x, W: F.convolution_2d(x, W, pad=1, groups=2),
        [rand((2, 4, 4, 4), F64), rand((6, 2, 3, 3), F64, seed=1)]),
    'deconvolution': (
        lambda x, W: F.deconvolution_2d(x, W, stride=2, pad=1),
        [rand((2, 3, 3, 3), F64), rand((3, 2, 3, 3), F64, seed=1)]),
    'batch_normalization': (
        _bn, [rand((4, 3, 2, 2), F64), rand((3,), F64, 0.5, 1.5, seed=1),
              rand((3,), F64, seed=2), rand((4, 3, 2, 2), F64, seed=3)]),
    'batch_normalization_relu': (  # relu's backward in BN's grad node
        _bn, [rand((4, 3, 2, 2), F64), rand((3,), F64, 0.5, 1.5, seed=1),
              rand((3,), F64, seed=2)]),
    'fixed_batch_normalization': (
        F.fixed_batch_normalization,
        [rand((4, 3, 2, 2), F64), rand((3,), F64, seed=1),
         rand((3,), F64, seed=2), rand((3,), F64, seed=3),
         rand((3,), F64, 0.5, 1.5, seed=4)]),
    'max_pooling': (
        lambda x: F.max_pooling_2d(x, 3, 2, 1, cover_all=True),
        [distinct((2, 3, 5, 5), F64)]),
    'average_pooling': (lambda x: F.average_pooling_2d(x, 3, 2, 1),
                        [rand((2, 3, 5, 5), F64)]),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_body_gradients(name):
    func, inputs = CASES[name]
    grad_check(func, inputs, F64)


@pytest.mark.parametrize('name', ['convolution_3x3', 'batch_normalization',
                                  'batch_normalization_relu', 'max_pooling',
                                  'linear'])
def test_body_second_order_gradients(name):
    func, inputs = CASES[name]
    double_grad_check(func, inputs, F64)
