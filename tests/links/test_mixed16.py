"""Chainer's mixed16 in the links (minichain/links/_mixed16.py): float32
parameters, 16-bit activations (bfloat16 on the CPU), batch normalization
and the loss in float32."""
import numpy
import pytest

import minichain
from minichain import functions as F, initializers, links as L, optimizers

ml_dtypes = pytest.importorskip('ml_dtypes')
BF16 = numpy.dtype(ml_dtypes.bfloat16)


def mixed16():
    return minichain.using_config('dtype', 'mixed16')


class _Net(minichain.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 8, 3, pad=1)
            self.bn = L.BatchNormalization(8)
            self.fc = L.Linear(None, 4)

    def forward(self, x):
        self.h = self.bn(self.conv(x))
        return self.fc(F.relu(self.h))


def _data(seed=0):
    rng = numpy.random.default_rng(seed)
    return (rng.standard_normal((6, 3, 5, 5)).astype(numpy.float32),
            numpy.arange(6, dtype=numpy.int32) % 4)


def test_dtypes_under_mixed16():
    with mixed16():
        assert minichain.get_dtype() == numpy.float16      # as Chainer's
        assert minichain.get_dtype(map_mixed16=numpy.float32) == \
            numpy.float32
        model = L.Classifier(_Net())
        x, t = _data()
        loss = model(x, t)
    assert model.predictor.h.dtype == BF16        # activations
    assert model.y.dtype == numpy.float32 and loss.dtype == numpy.float32
    loss.backward()
    for name, p in model.namedparams():           # the master copies
        assert p.dtype == numpy.float32 and p.grad.dtype == numpy.float32, \
            name
    assert model.predictor.bn.avg_mean.dtype == numpy.float32


def test_chainers_mixed16_object_turns_it_on_too():
    # config.dtype = chainer.mixed16 (an object, not the string) is the way
    # Chainer's docs write it: it used to give float32 activations.
    with minichain.using_config('dtype', minichain.mixed16):
        model = _Net()
        model(_data()[0])
    assert model.h.dtype == BF16
    assert all(p.dtype == numpy.float32 for p in model.params())


def test_batch_normalization_computes_in_float32():
    # The same 16-bit input, normalized by the float32 layer, gives the
    # float32 result rounded once to bfloat16.
    x = numpy.random.default_rng(1).standard_normal((8, 4, 3, 3)) * 50 + 300
    x16 = x.astype(BF16)
    bn, bn32 = L.BatchNormalization(4), L.BatchNormalization(4)
    with mixed16():
        y = bn(x16)
    want = bn32(x16.astype(numpy.float32)).array.astype(BF16)
    assert y.dtype == BF16
    numpy.testing.assert_array_equal(y.array, want)
    numpy.testing.assert_allclose(bn.avg_mean, bn32.avg_mean, rtol=1e-6)


def test_mixed16_gradients_are_float32_ones_within_bfloat16s_rounding():
    initializers.set_random_seed(2)
    x, t = _data(2)
    ref = L.Classifier(_Net())
    ref(x, t)                                     # lazy initialization
    low = L.Classifier(_Net())
    low(x, t)
    low.copyparams(ref)
    for model, config in ((ref, 'float32'), (low, 'mixed16')):
        model.cleargrads()
        with minichain.using_config('dtype', config):
            model(x, t).backward()
    assert low.predictor.h.dtype == BF16 and ref.predictor.h.dtype == \
        numpy.float32
    # Each gradient is a sum of products of bfloat16 activations (8 bits);
    # where its terms cancel (beta's: a sum over 150 pixels; the conv's
    # bias before batch normalization: zero but for roundoff), or where a
    # value next to ReLU's kink rounds to the other side, single elements
    # are off by up to 8% of the largest gradient (20 seeds). In norm, the
    # worst of 20 seeds was 2.4% of the largest gradient's: 10% here,
    # where a wrong cast, scale or dtype is off by 100%.
    scale = max(numpy.linalg.norm(p.grad) for p in ref.params())
    for (name, p), (_, q) in zip(ref.namedparams(), low.namedparams()):
        assert numpy.linalg.norm(q.grad - p.grad) <= 0.1 * scale, name


def test_an_mlp_trains_under_mixed16_with_loss_scaling():
    rng = numpy.random.default_rng(3)
    x = rng.standard_normal((64, 10)).astype(numpy.float32)
    t = (x[:, 0] > 0).astype(numpy.int32)
    model = L.Classifier(minichain.Sequential(L.Linear(10, 32), F.relu,
                                              L.Linear(32, 2)))
    opt = optimizers.Adam(alpha=0.01).setup(model)
    opt.loss_scaling()
    with mixed16():
        for _ in range(40):
            opt.update(model, x, t)
        assert model.predictor[0](x).dtype == BF16
    assert float(model.accuracy.array) > 0.95
    assert opt.loss_scale == 65504.0     # bfloat16 never overflowed
