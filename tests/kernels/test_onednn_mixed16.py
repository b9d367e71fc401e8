"""mixed16 on the CPU through the oneDNN kernels: bfloat16 activations
(``ml_dtypes``) read and written as they are by batch normalization (with
float32 gamma, beta and statistics), pooling, ReLU's backward and Add,
and cast to and from float32 by a reorder (the convolutions' bfloat16
arrays: test_onednn_bf16.py).

Each kernel is held to its op's body on the same bfloat16 inputs: the
same bits where neither rounds anything (relu, max pooling, one sum);
elsewhere within the bfloat16 rounding of the result (``U16`` of its
magnitude, and one ulp either way where the two round a float32 value
that lies near a tie differently) plus float32 sums.
"""
import copy

import numpy
import pytest

import minichain
from minichain import functions as F
from minichain import kernels, using_config
from minichain.functions import activation as A
from minichain.functions import basic_math as M
from minichain.functions import normalization as N
from minichain.functions.channel_layout import Layout

ml_dtypes = pytest.importorskip('ml_dtypes')
onednn = pytest.importorskip('minichain.kernels.onednn')
if not onednn.available():
    pytest.skip('oneDNN is not installed', allow_module_level=True)
BF16 = numpy.dtype(ml_dtypes.bfloat16)
U16 = 2.0 ** -8
# oneDNN 3.2 computes bfloat16 on AVX512 (with or without AVX512_BF16);
# below it a kernel may decline, and the body runs.
TAKES = onednn._fpmath.effective_isa()[1] & 0x27 == 0x27


@pytest.fixture(autouse=True)
def onednn_on():
    with using_config('use_onednn', 'auto'):
        yield


def _last(a):
    """``a`` (N, C, H, W) over NHWC memory, as the convolutions return."""
    return numpy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(
        0, 3, 1, 2)


def _rand(rng, shape, dtype=BF16, scale=1.0):
    a = (rng.standard_normal(shape) * scale).astype(numpy.float32)
    return _last(a.astype(dtype)) if len(shape) == 4 else a.astype(dtype)


def _run(node_type, node, inputs):
    """(kernel outputs or None, body outputs) on copies of the inputs."""
    kernel = kernels.registered(node_type, 'onednn').__wrapped__
    got = kernel(copy.deepcopy(node), inputs)
    return got, copy.deepcopy(node).forward(inputs)


def _close(got, want, roundings=1):
    """Within one bfloat16 ulp of ``want`` (the two round float32 values
    that differ in their last bits), plus ``roundings`` bfloat16 roundings
    of the largest value (sums that the body rounds at each term)."""
    got, want = (numpy.asarray(a, numpy.float64) for a in (got, want))
    bound = 2 * U16 * (numpy.abs(want) + roundings * numpy.abs(want).max())
    assert numpy.all(abs(got - want) <= bound + 1e-30)


@pytest.mark.parametrize('relu,residual', [(False, False), (True, False),
                                           (False, True), (True, True)])
def test_batch_normalization_reads_and_writes_bfloat16(relu, residual):
    rng = numpy.random.default_rng(relu + 2 * residual)
    shape = (4, 32, 6, 6)
    x = _rand(rng, shape, scale=3.0)
    gamma, beta = (_rand(rng, (32,), numpy.float32) for _ in range(2))
    inputs = (x, gamma, beta) + ((_rand(rng, shape),) if residual else ())
    node = N.BatchNormalization(Layout(shape, (0, 2, 3)), 2e-5, None, None,
                                0.9, relu)
    got, want = _run(N.BatchNormalization, node, inputs)
    if got is None:
        assert not TAKES
        return
    assert got[0].dtype == want[0].dtype == BF16
    assert onednn._dnnl.is_channels_last(got[0])
    _close(got[0], want[0], 0)
    # the backward (relu's mask from oneDNN's workspace where it fused it)
    y = F.batch_normalization(minichain.Variable(x), gamma, beta, relu=relu,
                              residual=inputs[3] if residual else None)
    bn = y.creator
    gy = _rand(rng, shape)
    back = (x, gamma, gy) + ((y.array,) if relu and not residual else ())
    grad = N.BatchNormalizationGrad(bn.lay, bn.eps, bn.mean, bn.inv_std,
                                    bn.centered, bn.relu_workspace)
    got, want = _run(N.BatchNormalizationGrad, grad, back)
    assert got is not None
    assert [a.dtype for a in got] == [BF16, numpy.float32, numpy.float32]
    for a, b in zip(got, want):
        _close(a, b, 0)


def test_pooling_reads_and_writes_bfloat16():
    # ResNet's 3x3/2 stem pooling, max and average: the kernels against
    # the bodies (the NumPy kernels decline bfloat16), both directions
    rng = numpy.random.default_rng(5)
    x = _rand(rng, (2, 16, 9, 9))
    gy = _rand(rng, (2, 16, 5, 5))
    for pool in (F.max_pooling_2d, F.average_pooling_2d):
        out = {}
        for mode in ('auto', 'never'):
            with using_config('use_onednn', mode):
                xv = minichain.Variable(x)
                y = pool(xv, 3, 2, 1)
                y.grad = gy
                y.backward()
            out[mode] = y, xv.grad
        (y, gx), (y0, gx0) = out['auto'], out['never']
        kernel = kernels.registered(type(y0.creator), 'onednn').__wrapped__
        if kernel(copy.deepcopy(y0.creator), (x,)) is None:
            assert not TAKES
            continue
        assert y.dtype == gx.dtype == BF16
        if pool is F.max_pooling_2d:    # a choice, nothing rounded
            assert numpy.array_equal(y.array.view(numpy.uint16),
                                     y0.array.view(numpy.uint16))
        else:
            _close(y.array, y0.array, 1)
        _close(gx, gx0, 4)    # overlapping windows: the body's bf16 sums


def test_relu_grad_and_add_are_the_bodies_bits():
    rng = numpy.random.default_rng(6)
    y = numpy.maximum(_rand(rng, (4, 64, 16, 16)), BF16.type(0))
    for gy in (_rand(rng, y.shape), numpy.ascontiguousarray(
            _rand(rng, y.shape)),   # another layout: reordered first
               numpy.broadcast_to(_rand(rng, (4, 64, 1, 1)), y.shape)):
        got, want = _run(A.ReLUGrad, A.ReLUGrad(), (y, gy))
        if got is None:
            assert not TAKES
            continue
        assert got[0].dtype == BF16
        assert numpy.array_equal(got[0].view(numpy.uint16),
                                 want[0].view(numpy.uint16))
    a, b = _rand(rng, (4, 64, 64, 64)), _rand(rng, (4, 64, 64, 64))
    got, want = _run(M.Add, M.Add(), (a, b))
    if got is not None:
        assert numpy.array_equal(got[0].view(numpy.uint16),
                                 want[0].view(numpy.uint16))
    else:
        assert not TAKES


def test_a_mixed16_resnet_block_trains_on_the_kernels():
    # conv -> batch norm + relu -> conv -> batch norm + residual + relu
    # under mixed16: every activation bfloat16, every gradient of a
    # parameter float32, and the same loss as with the kernels off within
    # bfloat16's rounding
    from minichain import links as L

    class Block(minichain.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.c1 = L.Convolution2D(16, 16, 3, pad=1, nobias=True)
                self.b1 = L.BatchNormalization(16)
                self.c2 = L.Convolution2D(16, 16, 3, pad=1, nobias=True)
                self.b2 = L.BatchNormalization(16)

        def forward(self, x):
            h = self.b1(self.c1(x), relu=True)
            return self.b2(self.c2(h), residual=x, relu=True)

    rng = numpy.random.default_rng(7)
    x = _rand(rng, (8, 16, 12, 12))
    losses = []
    for mode in ('auto', 'never'):
        minichain.initializers.set_random_seed(3)
        block = Block()
        with using_config('dtype', 'mixed16'), \
                using_config('use_onednn', mode):
            y = block(x)
            assert y.dtype == BF16
            loss = F.sum(F.cast(y, 'float32') ** 2)
            loss.backward()
        assert all(p.grad.dtype == numpy.float32 for p in block.params())
        losses.append(float(loss.array))
    assert abs(losses[0] - losses[1]) <= 0.05 * abs(losses[1])
