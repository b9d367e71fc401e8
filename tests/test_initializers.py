import io
import subprocess
import sys

import numpy
import pytest

from minichain import backend, initializers as I
from minichain import links as L


gpu = pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')


@pytest.fixture(autouse=True)
def _reset_seed():
    I.set_random_seed()
    yield
    I.set_random_seed()


def _fill(init, shape, dtype=numpy.float64):
    a = numpy.empty(shape, dtype=dtype)
    init(a)
    return a


def test_get_fans():
    assert I.get_fans((10, 4)) == (4, 10)
    assert I.get_fans((64, 32, 3, 5)) == (32 * 15, 64 * 15)
    with pytest.raises(ValueError, match=r'\(7,\)'):
        I.get_fans((7,))


@pytest.mark.parametrize('init,std', [
    (I.Normal(0.3), 0.3),
    (I.Uniform(0.3), 0.3 / numpy.sqrt(3)),
    (I.LeCunNormal(2.0), 2.0 * numpy.sqrt(1 / (32 * 9))),
    (I.GlorotUniform(1.5), 1.5 * numpy.sqrt(6 / (32 * 9 + 64 * 9) / 3)),
    (I.HeNormal(), numpy.sqrt(2 / (32 * 9))),
    (I.HeNormal(0.5, fan_option='fan_out'), 0.5 * numpy.sqrt(2 / (64 * 9))),
])
def test_random_statistics(init, std):
    a = _fill(init, (64, 32, 3, 3))  # 18432 samples
    assert abs(a.mean()) < 4 * std / numpy.sqrt(a.size)
    assert abs(a.std() / std - 1) < 0.03


def test_uniform_bounds():
    a = _fill(I.Uniform(0.2), (100, 50))
    assert a.min() >= -0.2 and a.max() <= 0.2 and a.max() > 0.19
    s = numpy.sqrt(6 / (50 + 100))
    b = _fill(I.GlorotUniform(), (100, 50))
    assert b.min() >= -s and b.max() <= s and b.max() > 0.95 * s


def test_constants_and_dtype():
    a = _fill(I.Constant(2.5), (2, 3))
    assert (a == 2.5).all()
    assert (_fill(I.Zero(), 4) == 0).all() and (_fill(I.One(), 4) == 1).all()
    row = _fill(I.Constant(numpy.array([1.0, 2.0])), (3, 2))
    numpy.testing.assert_array_equal(row, [[1, 2]] * 3)
    with pytest.raises(TypeError, match='float32.*float64|float64.*float32'):
        I.One(dtype=numpy.float32)(numpy.empty(2, dtype=numpy.float64))
    with pytest.raises(ValueError, match='fan_option'):
        I.HeNormal(fan_option='fan_avg')


def test_seed_reproducibility():
    I.set_random_seed(7)
    a = _fill(I.Normal(), (5, 5))
    b = _fill(I.Normal(), (5, 5))
    assert not numpy.array_equal(a, b)  # the stream advances
    I.set_random_seed(7)
    numpy.testing.assert_array_equal(_fill(I.Normal(), (5, 5)), a)
    I.set_random_seed(8)
    assert not numpy.array_equal(_fill(I.Normal(), (5, 5)), a)


def test_rng_argument_is_independent_of_shared_stream():
    g1 = _fill(I.HeNormal(rng=3), (4, 6))
    g2 = _fill(I.HeNormal(rng=numpy.random.default_rng(3)), (4, 6))
    numpy.testing.assert_array_equal(g1, g2)
    I.set_random_seed()
    shared = _fill(I.Normal(), (3,))
    I.set_random_seed()
    _fill(I.Normal(rng=5), (3,))
    numpy.testing.assert_array_equal(_fill(I.Normal(), (3,)), shared)


def test_dtype_does_not_change_the_draw():
    a = _fill(I.Normal(), (4, 4), numpy.float32)
    I.set_random_seed()
    b = _fill(I.Normal(), (4, 4), numpy.float64)
    numpy.testing.assert_array_equal(a, b.astype(numpy.float32))


_MODEL_SCRIPT = '''
import numpy
from minichain import links as L
numpy.save(__import__("sys").stdout.buffer, L.Linear(5, 4).W.array)
'''


def test_fresh_process_builds_the_same_model():
    res = subprocess.run([sys.executable, '-c', _MODEL_SCRIPT],
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    theirs = numpy.load(io.BytesIO(res.stdout))
    I.set_random_seed()  # the default seed, as in a fresh process
    numpy.testing.assert_array_equal(L.Linear(5, 4).W.array, theirs)


def test_generate_array_scalar_and_none():
    a = I.generate_array(3, (2, 2), numpy)
    assert a.dtype == numpy.float32 and (a == 3).all()
    b = I.generate_array(3, 4, numpy, dtype=numpy.float64)
    assert b.dtype == numpy.float64 and b.shape == (4,)
    c = I.generate_array(None, (2,), numpy)
    assert c.dtype == numpy.float32 and numpy.isnan(c).all()


def test_generate_array_from_array():
    src = numpy.arange(6, dtype=numpy.float64).reshape(2, 3)
    a = I.generate_array(src, (2, 3), numpy)
    # cast to the parameter's dtype (config.dtype here), as Chainer does
    assert a.dtype == numpy.float32 and a is not src
    assert I.generate_array(src, (2, 3), numpy, numpy.float64).dtype == \
        numpy.float64
    src[0, 0] = 100
    assert a[0, 0] == 0
    with pytest.raises(ValueError, match=r'\(2, 3\).*\(3, 2\)'):
        I.generate_array(src, (3, 2), numpy)


def test_generate_array_dtype_conflict_and_bad_type():
    with pytest.raises(ValueError, match='float64.*float16'):
        I.generate_array(I.Normal(dtype=numpy.float16), (2,), numpy,
                         dtype=numpy.float64)
    a = I.generate_array(I.Normal(dtype=numpy.float16), (2,), numpy)
    assert a.dtype == numpy.float16
    with pytest.raises(TypeError, match='str'):
        I.generate_array('zeros', (2,), numpy)
    d = I.generate_array(lambda arr: arr.fill(4), (2,), numpy)
    assert (d == 4).all()


@pytest.mark.gpu
@gpu
def test_gpu_array_gets_the_host_draw():
    cupy = backend.get_cupy()
    a = I.generate_array(I.HeNormal(), (8, 3, 3, 3), cupy)
    I.set_random_seed()
    b = I.generate_array(I.HeNormal(), (8, 3, 3, 3), numpy)
    assert isinstance(a, cupy.ndarray)
    numpy.testing.assert_array_equal(a.get(), b)
