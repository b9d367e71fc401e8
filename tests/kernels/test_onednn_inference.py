"""The oneDNN kernel of inference-mode batch normalization
(``FixedBatchNormalization``, kernels/onednn/normalization.py) against the
op's body at every batch-normalization shape of ResNet-50 (batch 2).

No sums: each output is ``(x - mean) * gamma / sqrt(var + eps) + beta``
rounded a few times on each side, so the two agree within 8 units of
roundoff of ``|x - mean| * |gamma| / sqrt(var + eps) + |beta|``,
element by element; a wrong statistic or channel is far outside.
"""
import numpy
import pytest

from minichain import kernels, using_config
from minichain import functions as F
from minichain.functions import normalization as N
from minichain.functions.channel_layout import Layout
from tests.kernels.test_onednn import (BNS, U, _both, _channels_last,
                                       _rand, _same_retained, onednn)


@pytest.fixture(autouse=True)
def onednn_on():
    with using_config('use_onednn', 'auto'):
        yield


def _stats(rng, c):
    gamma, beta, mean = _rand(rng, c), _rand(rng, c), _rand(rng, c)
    var = rng.uniform(0.05, 4.0, c).astype(numpy.float32)
    return gamma, beta, mean, var


@pytest.mark.parametrize('spec', BNS, ids=lambda s: 'n{}c{}h{}'.format(*s))
def test_fixed_batch_normalization_kernel_equals_body(spec):
    n, c, h = spec
    rng = numpy.random.default_rng(sum(spec))
    shape = (n, c, h, h)
    x = _channels_last(_rand(rng, shape) * 3 + 1)
    gamma, beta, mean, var = _stats(rng, c)
    lay = Layout(shape, (0, 2, 3))
    (y,), kn, (ref,), bn = _both(lambda: N.FixedBatchNormalization(lay, 2e-5),
                                 (x, gamma, beta, mean, var))
    assert onednn._dnnl.is_channels_last(y) and y.dtype == numpy.float32

    def b(v):
        return v.reshape(1, c, 1, 1)
    scale = abs(gamma) / numpy.sqrt(var.astype(numpy.float64) + 2e-5)
    bound = 8 * U * (abs(x - b(mean)) * b(scale) + abs(b(beta)))
    assert numpy.all(abs(y - ref) <= bound)
    _same_retained(kn, bn)


def test_what_it_declines_runs_the_body_through_the_seam():
    # NCHW x (data, NumPy code), float64, per-pixel statistics
    rng = numpy.random.default_rng(3)
    kernel = kernels.registered(N.FixedBatchNormalization, 'onednn')
    shape = (2, 16, 5, 5)
    gamma, beta, mean, var = _stats(rng, 16)
    x = _rand(rng, shape)
    lay = Layout(shape, (0, 2, 3))
    node = N.FixedBatchNormalization(lay, 2e-5)
    assert kernel(node, (x, gamma, beta, mean, var)) is None
    args64 = [a.astype(numpy.float64) for a in
              (_channels_last(x), gamma, beta, mean, var)]
    assert kernel(node, tuple(args64)) is None
    per_pixel = Layout(shape, (0,))
    stats = [rng.standard_normal(shape[1:]).astype(numpy.float32)
             for _ in range(4)]
    stats[3] = abs(stats[3]) + 1
    assert kernel(N.FixedBatchNormalization(per_pixel, 2e-5),
                  (_channels_last(x), *stats)) is None
    # through the seam: the NumPy path's values (a NumPy kernel or the
    # body), to float32 rounding
    y = F.fixed_batch_normalization(x, gamma, beta, mean, var).array
    with using_config('use_kernels', False):
        ref = F.fixed_batch_normalization(x, gamma, beta, mean,
                                          var).array
    numpy.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
