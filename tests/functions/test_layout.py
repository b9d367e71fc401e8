"""Channel-major activations (minichain/kernels/numpy/_layout.py): the helpers,
and every CPU op that keeps the layout gives the same values and gradients
as on C-contiguous arrays."""
import numpy
import pytest

from minichain import Variable
import minichain.functions as F
from minichain.kernels.numpy import _layout
from tests.functions._util import distinct, grad_check, rand


def _cm(a):
    """``a`` copied into channel-major memory."""
    out = _layout.empty_channel_major(a.shape, a.dtype)
    out[...] = a
    return out


def test_helpers():
    a = _layout.zeros_channel_major((2, 3, 4, 5), numpy.float32)
    assert a.shape == (2, 3, 4, 5) and not a.any()
    assert _layout.channel_major(a).shape == (3, 2, 4, 5)
    assert _layout.channel_major(numpy.zeros((2, 3, 4))) is None
    assert _layout.channel_major(numpy.zeros(3)) is None
    assert _layout.dense_order(a) == (1, 0, 2, 3)
    assert _layout.dense_order(numpy.zeros((2, 3))[:, :2]) is None
    assert _layout.dense_order(numpy.broadcast_to(numpy.ones(3), (2, 3))) \
        is None
    assert _layout.empty_like_dense(a).strides == a.strides
    b = numpy.broadcast_to(numpy.ones(5), (2, 3, 4, 5))
    assert _layout.empty_like_dense(b, a).strides == a.strides
    assert _layout.empty_like_dense(b).flags.c_contiguous


def test_flat_views_need_one_order():
    a, b = _cm(rand((2, 3, 4, 4), numpy.float64)), rand((2, 3, 4, 4),
                                                        numpy.float64)
    views = _layout.flat_views(a, a)
    assert views is not None and views[0].base is not None
    assert _layout.flat_views(a, b) is None


def test_conv_writes_channel_major_and_reads_any():
    x = rand((3, 4, 6, 6), numpy.float64)
    W = rand((5, 4, 3, 3), numpy.float64, seed=1)
    y = F.convolution_2d(x, W, pad=1).array
    assert _layout.channel_major(y) is not None
    for k, pad in ((3, 1), (1, 0)):
        Wk = W[:, :, :k, :k].copy()
        ref = F.convolution_2d(x, Wk, pad=pad).array
        numpy.testing.assert_allclose(
            F.convolution_2d(_cm(x), Wk, pad=pad).array, ref, rtol=1e-12)


@pytest.mark.parametrize('op', ['relu', 'add', 'bn', 'max', 'avg'])
def test_ops_keep_layout_and_values(op):
    x = distinct((4, 3, 6, 6), numpy.float64, gap=0.01)
    gamma, beta = rand((3,), numpy.float64, 0.5, 1.5), rand((3,),
                                                            numpy.float64)
    f = {'relu': F.relu,
         'add': lambda v: v + v,
         'bn': lambda v: F.batch_normalization(v, gamma, beta),
         'max': lambda v: F.max_pooling_2d(v, 3, 2, 1),
         'avg': lambda v: F.average_pooling_2d(v, 3, 2, 1)}[op]
    v = Variable(_cm(x))
    y = f(v)
    assert _layout.channel_major(y.array) is not None
    numpy.testing.assert_allclose(y.array, f(Variable(x)).array, rtol=1e-12,
                                  atol=1e-12)
    y.grad = _cm(rand(y.shape, numpy.float64, seed=2))
    y.backward()
    ref = Variable(x)
    yr = f(ref)
    yr.grad = numpy.ascontiguousarray(y.grad)
    yr.backward()
    numpy.testing.assert_allclose(v.grad, ref.grad, rtol=1e-12, atol=1e-12)


def test_gradient_through_channel_major_chain():
    """A conv's channel-major output through BN, ReLU, pooling, a 1x1 conv
    and a residual add: the float64 gradient check."""
    x = rand((2, 3, 5, 5), numpy.float64)
    W1 = rand((4, 3, 3, 3), numpy.float64, seed=1)
    W2 = rand((4, 4, 1, 1), numpy.float64, seed=2)
    gamma, beta = rand((4,), numpy.float64, 0.5, 1.5, 3), rand(
        (4,), numpy.float64, seed=4)

    def f(x, W1, W2, gamma, beta):
        h = F.batch_normalization(F.convolution_2d(x, W1, pad=1), gamma, beta)
        h = F.relu(h)
        h = h + F.convolution_2d(h, W2)
        return F.average_pooling_2d(F.max_pooling_2d(h, 2, 1), 2, 2)
    grad_check(f, (x, W1, W2, gamma, beta), numpy.float64)
