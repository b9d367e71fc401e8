import warnings

import numpy
import pytest

import minichain
from minichain import backend
from minichain import functions as F
from minichain import initializers
from minichain import links as L


def _x(shape=(6, 3, 2, 2), dtype=numpy.float32, seed=0):
    rng = numpy.random.default_rng(seed)
    return (rng.standard_normal(shape) * 2 + 1).astype(dtype)


def test_parameters_and_persistents():
    bn = L.BatchNormalization(3)
    assert [name for name, _ in bn.namedparams()] == ['/beta', '/gamma']
    numpy.testing.assert_array_equal(bn.gamma.array, numpy.ones(3))
    numpy.testing.assert_array_equal(bn.beta.array, numpy.zeros(3))
    assert bn.gamma.dtype == numpy.float32
    persist = dict(bn.namedpersistents())
    assert sorted(persist) == ['/N', '/avg_mean', '/avg_var']
    numpy.testing.assert_array_equal(persist['/avg_mean'], numpy.zeros(3))
    numpy.testing.assert_array_equal(persist['/avg_var'], numpy.ones(3))
    assert persist['/N'] == 0


def test_training_uses_batch_stats_and_updates_running_stats():
    x = _x()
    bn = L.BatchNormalization(3, decay=0.8)
    y = bn(x)
    expected = F.batch_normalization(x, numpy.ones(3, numpy.float32),
                                     numpy.zeros(3, numpy.float32))
    numpy.testing.assert_allclose(y.array, expected.array, atol=1e-6)
    x64 = x.astype(numpy.float64)
    mean, var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    m = 6 * 2 * 2
    numpy.testing.assert_allclose(bn.avg_mean, 0.2 * mean, rtol=1e-5)
    numpy.testing.assert_allclose(bn.avg_var, 0.8 + 0.2 * var * m / (m - 1),
                                  rtol=1e-5)


def test_train_and_test_mode_differ():
    x = _x()
    bn = L.BatchNormalization(3)
    y_train = bn(x).array
    with minichain.using_config('train', False):
        y_test = bn(x).array
    assert not numpy.allclose(y_train, y_test, atol=1e-2)
    expected = F.fixed_batch_normalization(
        x, bn.gamma.array, bn.beta.array, bn.avg_mean, bn.avg_var)
    numpy.testing.assert_allclose(y_test, expected.array, atol=1e-6)


def test_test_mode_leaves_statistics_alone():
    bn = L.BatchNormalization(3)
    with minichain.using_config('train', False):
        bn(_x())
    numpy.testing.assert_array_equal(bn.avg_mean, numpy.zeros(3))
    numpy.testing.assert_array_equal(bn.avg_var, numpy.ones(3))


def test_finetune_accumulates_plain_average():
    xs = [_x(seed=s) for s in (1, 2)]
    bn = L.BatchNormalization(3)
    for x in xs:
        bn(x, finetune=True)
    assert bn.N == 2
    means = [x.astype(numpy.float64).mean(axis=(0, 2, 3)) for x in xs]
    numpy.testing.assert_allclose(bn.avg_mean, (means[0] + means[1]) / 2,
                                  rtol=1e-5)


def test_gradients_reach_parameters():
    x = _x()
    bn = L.BatchNormalization(3)
    w = numpy.random.default_rng(3).standard_normal(x.shape).astype(
        numpy.float32)
    F.sum(bn(x) * w).backward()
    gamma = minichain.Variable(numpy.ones(3, numpy.float32))
    beta = minichain.Variable(numpy.zeros(3, numpy.float32))
    F.sum(F.batch_normalization(x, gamma, beta) * w).backward()
    numpy.testing.assert_allclose(bn.gamma.grad, gamma.grad, atol=1e-5)
    numpy.testing.assert_allclose(bn.beta.grad, beta.grad, atol=1e-5)


def test_without_gamma_and_beta():
    bn = L.BatchNormalization(3, use_gamma=False, use_beta=False)
    assert bn.gamma is None and bn.beta is None
    assert list(bn.params()) == []
    x = _x()
    ref = L.BatchNormalization(3)
    numpy.testing.assert_allclose(bn(x).array, ref(x).array, atol=1e-6)


def test_initial_values_and_dtype():
    bn = L.BatchNormalization(2, dtype=numpy.float64, initial_gamma=2.0,
                              initial_beta=initializers.Constant(-1.0))
    assert bn.gamma.dtype == bn.avg_mean.dtype == numpy.float64
    assert bn.beta.dtype == numpy.float64
    numpy.testing.assert_array_equal(bn.gamma.array, [2.0, 2.0])
    numpy.testing.assert_array_equal(bn.beta.array, [-1.0, -1.0])
    bn = L.BatchNormalization(2, initial_gamma=numpy.array(
        [0.5, 3.0], numpy.float32))
    numpy.testing.assert_array_equal(bn.gamma.array, [0.5, 3.0])


def test_lazy_size_and_axis():
    bn = L.BatchNormalization()
    y = bn(_x((4, 5)))
    assert bn.gamma.shape == bn.avg_mean.shape == (5,)
    assert y.shape == (4, 5)
    bn = L.BatchNormalization(axis=(0, 1))
    x = _x((3, 4, 6))
    y = bn(x).array
    assert bn.gamma.shape == (6,)
    x64 = x.astype(numpy.float64)
    ref = (x64 - x64.mean(axis=(0, 1))) / numpy.sqrt(
        x64.var(axis=(0, 1)) + 2e-5)
    numpy.testing.assert_allclose(y, ref, atol=1e-5)


def test_residual_and_relu_in_training_and_evaluation():
    """``bn(x, residual=s, relu=True)`` is ``relu(bn(x) + s)`` in both
    modes (fused in training, separate ops in evaluation), and updates
    the running statistics as a plain call does."""
    rng = numpy.random.default_rng(5)
    x, s = rng.standard_normal((2, 4, 3, 2, 2)).astype(numpy.float32)
    fused, plain = L.BatchNormalization(3), L.BatchNormalization(3)
    for train in (True, False):
        with minichain.using_config('train', train):
            got = fused(x, residual=s, relu=True).array
            want = F.relu(plain(x) + s).array
        assert numpy.array_equal(got, want), train
        assert numpy.array_equal(fused.avg_mean, plain.avg_mean)
        assert numpy.array_equal(fused.avg_var, plain.avg_var)
    assert (got == 0).any() and (got > 0).any()


def test_channel_mismatch_error():
    bn = L.BatchNormalization(4)
    with pytest.raises(ValueError, match=r'gamma has shape \(4,\)'):
        bn(_x())


def test_copyparams_copies_running_stats():
    a, b = L.BatchNormalization(3), L.BatchNormalization(3)
    a(_x())
    b.copyparams(a)
    numpy.testing.assert_array_equal(b.avg_mean, a.avg_mean)
    numpy.testing.assert_array_equal(b.avg_var, a.avg_var)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_to_gpu_round_trip():
    bn = L.BatchNormalization(3)
    x = _x()
    y_cpu = bn(x).array
    bn_cpu_mean = bn.avg_mean.copy()
    bn.avg_mean[...] = 0
    bn.avg_var[...] = 1
    bn.to_gpu()
    assert backend.get_device_id(bn.avg_mean) >= 0
    y_gpu = bn(backend.to_gpu(x)).array
    numpy.testing.assert_allclose(backend.to_cpu(y_gpu), y_cpu, atol=1e-5)
    bn.to_cpu()
    assert isinstance(bn.avg_mean, numpy.ndarray)
    numpy.testing.assert_allclose(bn.avg_mean, bn_cpu_mean, atol=1e-5)


@pytest.mark.parametrize('bad', [numpy.nan, numpy.inf])
@pytest.mark.parametrize('finetune', [False, True])
def test_a_batch_with_nan_or_inf_leaves_the_statistics_and_says_so(
        bad, finetune):
    # One NaN used to make avg_mean [0.047 nan 0.046] for good: every later
    # evaluation was NaN and nothing said why.
    class Net(minichain.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.bn1 = L.BatchNormalization(3)

    net = Net()
    bn = net.bn1
    x = numpy.random.default_rng(0).standard_normal((4, 3, 2, 2)).astype(
        numpy.float32)
    bn(x, finetune=finetune)
    mean, var, n = bn.avg_mean.copy(), bn.avg_var.copy(), bn.N
    x[2, 1, 0, 1] = bad
    with pytest.warns(RuntimeWarning, match=(
            r"BatchNormalization 'bn1': the batch statistics are not finite "
            r'\(channel 1: mean (nan|inf), variance (nan|inf); 1 of 3 '
            r'channels\): the input holds NaN or inf; avg_mean and avg_var '
            r'were left as they were')):
        y = bn(x, finetune=finetune)
    assert not numpy.isfinite(y.array).all()  # the step itself is not hidden
    numpy.testing.assert_array_equal(bn.avg_mean, mean)
    numpy.testing.assert_array_equal(bn.avg_var, var)
    assert bn.N == n
    with warnings.catch_warnings():
        warnings.filterwarnings('error', '.*batch statistics')  # once
        bn(x, finetune=finetune)
    numpy.testing.assert_array_equal(bn.avg_mean, mean)
    with minichain.using_config('train', False):
        assert numpy.isfinite(bn(x[:2, :, :, :1]).array).sum() > 0
