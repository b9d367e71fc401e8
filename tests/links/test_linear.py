import numpy
import pytest

import minichain
from minichain import backend, initializers as I
from minichain import links as L
from minichain.gradient_check import check_backward


gpu = pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')


def test_forward_matches_numpy():
    rng = numpy.random.default_rng(0)
    link = L.Linear(4, 3)
    link.b.array[...] = [0.5, -1.0, 2.0]
    x = rng.standard_normal((5, 4)).astype(numpy.float32)
    y = link(x)
    expected = x @ link.W.array.T + link.b.array
    assert y.shape == (5, 3) and y.dtype == numpy.float32
    numpy.testing.assert_allclose(y.array, expected, rtol=1e-6, atol=1e-6)


def test_short_form_and_lazy_init_flattens():
    link = L.Linear(3)
    assert link.in_size is None and not link.W.is_initialized
    assert link.b.shape == (3,)
    x = numpy.ones((2, 6, 1, 1), dtype=numpy.float32)
    y = link(x)
    assert link.W.shape == (3, 6) and link.in_size == 6
    numpy.testing.assert_allclose(
        y.array, x.reshape(2, 6) @ link.W.array.T, rtol=1e-6)


def test_default_init_is_lecun_normal():
    link = L.Linear(400, 300)
    w = link.W.array
    assert abs(w.std() * numpy.sqrt(400) - 1) < 0.03
    assert (link.b.array == 0).all()


def test_nobias():
    link = L.Linear(2, 3, nobias=True)
    assert link.b is None
    assert [p for p, _ in link.namedparams()] == ['/W']
    assert link.count_params() == 6


def test_initializer_scalar_and_array_arguments():
    a = L.Linear(2, 3, initialW=I.Constant(0.25), initial_bias=1)
    assert (a.W.array == 0.25).all() and (a.b.array == 1).all()
    assert a.W.dtype == a.b.dtype == numpy.float32
    w = numpy.arange(6, dtype=numpy.float64).reshape(3, 2)
    # an array is cast to the link's dtype (config.dtype), as in Chainer:
    # a float64 array must not make float32 inputs fail
    b = L.Linear(2, 3, initialW=w, initial_bias=0.5)
    assert b.W.dtype == numpy.float32 and b.b.dtype == numpy.float32
    numpy.testing.assert_array_equal(b.W.array, w)
    assert b(numpy.ones((1, 2), numpy.float32)).dtype == numpy.float32
    w[0, 0] = 99  # the link holds a copy
    assert b.W.array[0, 0] == 0
    bias = numpy.array([1, 2, 3], dtype=numpy.float16)
    with minichain.using_config('dtype', numpy.float64):
        c = L.Linear(None, 3, initialW=w, initial_bias=bias)
    assert not c.W.is_initialized and c.b.dtype == numpy.float64
    d = L.Linear(2, 3, initialW=7.0)
    assert (d.W.array == 7).all()


def test_array_shape_mismatch():
    w = numpy.zeros((2, 3), dtype=numpy.float32)
    with pytest.raises(ValueError, match=r'\(2, 3\).*\(3, 2\)'):
        L.Linear(2, 3, initialW=w)
    lazy = L.Linear(3, initialW=w.T)
    with pytest.raises(ValueError, match=r'\(3, 2\).*\(3, 4\)'):
        lazy(numpy.ones((1, 4), dtype=numpy.float32))


@pytest.mark.parametrize('dtype,tol', [(numpy.float64, dict(
    eps=1e-6, atol=1e-7, rtol=1e-6)), (numpy.float32, dict(
        eps=1e-2, atol=1e-2, rtol=5e-3))])
def test_backward_through_params(dtype, tol):
    rng = numpy.random.default_rng(1)
    with minichain.using_config('dtype', dtype):
        link = L.Linear(3, 2, initialW=rng.standard_normal((2, 3)),
                        initial_bias=rng.standard_normal(2))
    assert link.W.dtype == dtype
    x = rng.standard_normal((4, 3)).astype(dtype)
    gy = rng.standard_normal((4, 2)).astype(dtype)
    check_backward(link, x, gy, params=(link.W, link.b), **tol)


def test_repr():
    assert repr(L.Linear(3)) == ('Linear(in_size=None, out_size=3, '
                                 'nobias=False)')


@pytest.mark.gpu
@gpu
def test_lazy_init_on_gpu():
    cupy = backend.get_cupy()
    link = L.Linear(2).to_gpu()
    y = link(cupy.ones((3, 4), dtype=cupy.float32))
    assert isinstance(link.W.array, cupy.ndarray)
    assert isinstance(y.array, cupy.ndarray) and y.shape == (3, 2)
    link.to_cpu()
    assert isinstance(link.W.array, numpy.ndarray)
