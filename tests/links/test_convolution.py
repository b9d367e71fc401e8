import numpy
import pytest

import minichain

from minichain import backend, initializers as I
from minichain import links as L
from minichain.gradient_check import check_backward


gpu = pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')


def _naive_conv(x, W, b, stride, pad, dilate=1, groups=1):
    """Loop reference: NCHW input, (out, in/groups, kh, kw) weight."""
    n, c, h, w = x.shape
    out, cg, kh, kw = W.shape
    xp = numpy.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho = (h + 2 * pad - dilate * (kh - 1) - 1) // stride + 1
    wo = (w + 2 * pad - dilate * (kw - 1) - 1) // stride + 1
    y = numpy.zeros((n, out, ho, wo), dtype=numpy.float64)
    per_group = out // groups
    for o in range(out):
        g = o // per_group
        for i in range(ho):
            for j in range(wo):
                i0, j0 = i * stride, j * stride
                patch = xp[:, g * cg:(g + 1) * cg,
                           i0:i0 + dilate * (kh - 1) + 1:dilate,
                           j0:j0 + dilate * (kw - 1) + 1:dilate]
                y[:, o, i, j] = (patch * W[o]).sum(axis=(1, 2, 3))
    if b is not None:
        y += b[None, :, None, None]
    return y


@pytest.mark.parametrize('stride,pad,dilate,groups', [
    (1, 0, 1, 1), (2, 1, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2)])
def test_forward_matches_naive(stride, pad, dilate, groups):
    rng = numpy.random.default_rng(0)
    link = L.Convolution2D(4, 6, 3, stride=stride, pad=pad, dilate=dilate,
                           groups=groups, initial_bias=I.Normal(1.0))
    assert link.W.shape == (6, 4 // groups, 3, 3)
    x = rng.standard_normal((2, 4, 7, 6)).astype(numpy.float32)
    y = link(x)
    expected = _naive_conv(x, link.W.array, link.b.array, stride, pad,
                           dilate, groups)
    assert y.dtype == numpy.float32 and y.shape == expected.shape
    numpy.testing.assert_allclose(y.array, expected, rtol=1e-5, atol=1e-5)


def test_short_form_and_lazy_init():
    link = L.Convolution2D(5, 3)
    assert link.in_channels is None and link.out_channels == 5
    assert link.ksize == (3, 3) and not link.W.is_initialized
    x = numpy.ones((1, 2, 4, 4), dtype=numpy.float32)
    y = link(x)
    assert link.W.shape == (5, 2, 3, 3) and y.shape == (1, 5, 2, 2)
    assert link.in_channels == 2


def test_rectangular_kernel_nobias_and_fans():
    link = L.Convolution2D(8, 300, (1, 3), nobias=True,
                           initialW=I.HeNormal())
    assert link.b is None and link.W.shape == (300, 8, 1, 3)
    std = link.W.array.std()
    assert abs(std / numpy.sqrt(2 / (8 * 3)) - 1) < 0.03


def test_initializer_arguments():
    w = numpy.full((2, 3, 1, 1), 0.5, dtype=numpy.float64)
    link = L.Convolution2D(3, 2, 1, initialW=w, initial_bias=1)
    # an array is cast to the link's dtype, as in Chainer
    assert link.W.dtype == numpy.float32 and link.b.dtype == numpy.float32
    assert (link.b.array == 1).all()
    with minichain.using_config('dtype', numpy.float64):
        wide = L.Convolution2D(3, 2, 1, initialW=w, initial_bias=1)
    assert wide.W.dtype == numpy.float64 and wide.b.dtype == numpy.float64
    w[...] = 0
    assert (link.W.array == 0.5).all()
    with pytest.raises(ValueError, match=r'\(2, 3, 1, 1\).*\(2, 3, 3, 3\)'):
        L.Convolution2D(3, 2, 3, initialW=w)
    scal = L.Convolution2D(3, 2, 2, initialW=0.1, initial_bias=I.One())
    assert (scal.W.array == numpy.float32(0.1)).all()
    assert scal.W.dtype == numpy.float32 and (scal.b.array == 1).all()


def test_groups_must_divide_channels():
    with pytest.raises(ValueError, match='out_channels=5.*groups=2'):
        L.Convolution2D(4, 5, 3, groups=2)
    with pytest.raises(ValueError, match='in_channels=3.*groups=2'):
        L.Convolution2D(3, 4, 3, groups=2)
    lazy = L.Convolution2D(None, 4, 3, groups=2)
    with pytest.raises(ValueError, match='in_channels=3.*groups=2'):
        lazy(numpy.ones((1, 3, 5, 5), dtype=numpy.float32))


@pytest.mark.parametrize('dtype,tol', [(numpy.float64, dict(
    eps=1e-6, atol=1e-7, rtol=1e-6)), (numpy.float32, dict(
        eps=1e-2, atol=1e-2, rtol=5e-3))])
def test_backward_through_params(dtype, tol):
    rng = numpy.random.default_rng(2)
    with minichain.using_config('dtype', dtype):
        link = L.Convolution2D(
            2, 3, 2, stride=1, pad=1,
            initialW=rng.standard_normal((3, 2, 2, 2)),
            initial_bias=rng.standard_normal(3))
    assert link.W.dtype == dtype
    x = rng.standard_normal((1, 2, 3, 3)).astype(dtype)
    gy = rng.standard_normal((1, 3, 4, 4)).astype(dtype)
    check_backward(link, x, gy, params=(link.W, link.b), **tol)


def test_repr():
    text = repr(L.Convolution2D(3, 8, 3, stride=2, pad=1, groups=1))
    assert text == ('Convolution2D(in_channels=3, out_channels=8, '
                    'ksize=(3, 3), stride=2, pad=1, nobias=False)')


@pytest.mark.gpu
@gpu
def test_forward_on_gpu_matches_cpu():
    cupy = backend.get_cupy()
    link = L.Convolution2D(3, 4, 3, pad=1)
    x = numpy.random.default_rng(3).standard_normal(
        (2, 3, 5, 5)).astype(numpy.float32)
    y_cpu = link(x).array
    link.to_gpu()
    y_gpu = link(cupy.asarray(x)).array
    assert isinstance(y_gpu, cupy.ndarray)
    numpy.testing.assert_allclose(y_gpu.get(), y_cpu, rtol=1e-5, atol=1e-5)
