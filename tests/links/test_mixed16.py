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


def _bn_case(seed, layout):
    rng = numpy.random.default_rng(seed)
    x = (rng.standard_normal((6, 5, 4, 4)) * 2 + 1).astype(BF16)
    if layout == 'channels-last':   # as the oneDNN convolutions return
        x = numpy.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(
            0, 3, 1, 2)
    gamma, beta = (rng.uniform(0.5, 1.5, 5).astype(numpy.float32)
                   for _ in range(2))
    return x, gamma, beta, rng.standard_normal(x.shape).astype(BF16)


@pytest.mark.parametrize('layout', ['C', 'channels-last'])
def test_batch_normalization_takes_float32_parameters_for_a_16bit_x(layout):
    # Chainer's mixed16: a bfloat16 x with the float32 layer's gamma and
    # beta, normalized with float32 statistics (the body, or oneDNN's
    # bfloat16 kernel on channels-last x): the float32 result, rounded to
    # bfloat16, to one ulp; gradients of x's and the parameters' types.
    x, gamma, beta, gy = _bn_case(4, layout)
    rm = numpy.zeros(5, numpy.float32)
    vs = [minichain.Variable(a) for a in (x, gamma, beta)]
    y = F.batch_normalization(*vs, running_mean=rm, relu=True)
    y.grad = gy
    y.backward()
    ws = [minichain.Variable(a) for a in (x.astype(numpy.float32), gamma,
                                          beta)]
    y32 = F.batch_normalization(*ws, relu=True)
    y32.grad = gy.astype(numpy.float32)
    y32.backward()
    assert y.dtype == BF16 and rm.dtype == numpy.float32 and rm.any()
    assert [v.grad.dtype for v in vs] == [BF16, numpy.float32, numpy.float32]
    want = y32.array.astype(numpy.float64)
    assert numpy.all(abs(y.array.astype(numpy.float64) - want)
                     <= 2 ** -7 * abs(want) + 1e-6)
    for v, w in zip(vs, ws):
        g, h = v.grad.astype(numpy.float64), w.grad.astype(numpy.float64)
        assert numpy.linalg.norm(g - h) <= 2 ** -7 * numpy.linalg.norm(h)


def test_batch_normalizations_double_backward_under_mixed16():
    # the fused backward's own backward runs in the parameters' float32
    # (its F functions want one dtype) and hands x its own type back
    x, gamma, beta, gy = _bn_case(5, 'C')
    w = numpy.random.default_rng(6).standard_normal(x.shape)
    grads = []
    for xs in (x, x.astype(numpy.float32)):
        vs = [minichain.Variable(a) for a in (xs, gamma, beta)]
        y = F.batch_normalization(*vs)
        y.grad = gy.astype(xs.dtype)
        y.backward(enable_double_backprop=True)
        gx = vs[0].grad_var
        for v in vs:
            v.cleargrad()
        F.sum(F.cast(gx, 'float32') * w.astype(numpy.float32)).backward()
        grads.append([vs[0].grad, vs[1].grad])
    (gx16, gg16), (gx32, gg32) = grads
    assert gx16.dtype == BF16 and gg16.dtype == numpy.float32
    for a, b in ((gx16, gx32), (gg16, gg32)):
        a, b = a.astype(numpy.float64), b.astype(numpy.float64)
        assert numpy.linalg.norm(a - b) <= 2 ** -6 * numpy.linalg.norm(b)


def test_batch_normalization_still_refuses_other_mixtures():
    x, gamma, beta, _ = _bn_case(7, 'C')
    for args in ((x, gamma.astype(numpy.float64), beta),   # not float32
                 (x.astype(numpy.float32), gamma.astype(BF16),
                  beta.astype(BF16)),                      # 16-bit params
                 (x, gamma, beta.astype(BF16))):           # two types
        with pytest.raises(TypeError, match='batch_normalization: inputs '
                           'must share one dtype'):
            F.batch_normalization(*args)
    with pytest.raises(TypeError, match='fixed_batch_normalization'):
        F.fixed_batch_normalization(x, gamma, beta, gamma, gamma)
