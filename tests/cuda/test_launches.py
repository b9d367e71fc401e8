"""Kernel launches of a ResNet-50 training step on CuPy, counted through
CUPTI (bench/_launches.py), on a device (``-m gpu``). The reading of
issue 40 found 2,300 / 2,800 / 7,000 launches per step at batch 32 / 64 /
256 for the convolution's columns alone (one copy per kernel window),
about 30 per batch normalization layer and four per parameter in the
optimizer; here the columns are one launch whatever the window, a batch
normalization four each way, the update one for all parameters, and the
count does not grow with the batch."""
import os
import sys

import numpy
import pytest

import minichain
from minichain import backend, optimizers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), 'bench'))
import _launches  # noqa: E402
from models.resnet import ResNet, loss_and_accuracy  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')]

# The reading's sum at batch 32: columns, 53 batch normalizations, 161
# parameters' updates
READING = 2300 + 30 * 53 + 4 * 161
# ... less what the fused batch normalization saves (at least 13 launches
# forward and 7 backward per layer) and the one-launch update (160)
CEILING = READING - 20 * 53 - 160


def _counted(fn):
    if _launches.problem():
        pytest.skip(_launches.problem())
    fn()                                   # compile, allocate, init state
    with _launches.Launches() as n:
        fn()
    return n.count


def test_a_convolution_launches_as_many_kernels_for_any_window():
    from minichain import Variable, functions as F
    rng = numpy.random.default_rng(1)
    x = Variable(backend.to_gpu(rng.standard_normal(
        (2, 8, 16, 16)).astype(numpy.float32), 0))
    counts = []
    for k in (3, 7):
        W = Variable(backend.to_gpu(rng.standard_normal(
            (8, 8, k, k)).astype(numpy.float32), 0))

        def step():
            F.sum(F.convolution_2d(x, W, stride=2, pad=k // 2)).backward()
        with minichain.using_config('use_cudnn', 'never'):
            counts.append(_counted(step))
    assert counts[0] == counts[1], counts


def test_a_batch_normalization_launches_a_few_kernels():
    """Forward (residual and ReLU, running statistics) and backward: two
    reductions, the per-channel kernel and one pass over x each way, and
    ReLU's gradient; about 30 before."""
    from minichain import Variable, functions as F
    rng = numpy.random.default_rng(2)

    def gpu(*shape):
        return backend.to_gpu(rng.standard_normal(shape).astype(
            numpy.float32), 0)
    x, r, gy = Variable(gpu(4, 8, 6, 6)), Variable(gpu(4, 8, 6, 6)), gpu(
        4, 8, 6, 6)
    gamma, beta, mean, var = (Variable(gpu(8)), Variable(gpu(8)), gpu(8),
                              gpu(8) ** 2)

    def step():
        y = F.batch_normalization(x, gamma, beta, running_mean=mean,
                                  running_var=var, residual=r, relu=True)
        y.grad = gy
        y.backward()
        for v in (x, r, gamma, beta):
            v.cleargrad()
    with minichain.using_config('use_cudnn', 'never'):
        count = _counted(step)
    assert count <= 10, count


def test_a_resnet50_step_launches_fewer_kernels():
    model = ResNet('resnet50', 1000, 'imagenet')
    model.to_gpu(0)
    opt = optimizers.MomentumSGD(lr=0.01, momentum=0.9).setup(model)
    rng = numpy.random.default_rng(0)
    counts = {}
    with minichain.using_config('use_cudnn', 'never'):
        for batch in (2, 4):
            x = backend.to_gpu(rng.standard_normal(
                (batch, 3, 64, 64)).astype(numpy.float32), 0)
            t = backend.to_gpu(rng.integers(0, 1000, batch).astype(
                numpy.int32), 0)
            counts[batch] = _counted(
                lambda: opt.update(loss_and_accuracy, model, x, t))
        update = _counted(lambda: opt.update())
    n_params = len(list(model.params()))
    print('launches per ResNet-50 step: {} (batch 2), {} (batch 4); '
          'update {} for {} parameters'.format(counts[2], counts[4], update,
                                               n_params))
    assert update == 1 and n_params == 161  # one dtype, one device
    assert counts[2] == counts[4]
    assert counts[2] < CEILING, counts
