"""The CUDA kernels of the convolution nodes equal the bodies.

Without a GPU: the ElementwiseKernels run as C++ on the CPU
(``tests/functions/cuda_emulation.py``) on NumPy arrays, and the array
functions of ``minichain/kernels/cuda/im2col.py`` (the columns, the
products, col2im) are compared with the nodes' bodies in float64 at the
convolution kinds of ResNet-50: 3x3 (stride 1 and 2), 1x1 (stride 1 and
2), the 7x7/2 stem and the small2 stem's 3x3/2, with groups too.
"""
import numpy
import pytest

from minichain.functions import _geometry
from minichain.functions.convolution import (Convolution2D,
                                             Convolution2DGradW,
                                             Deconvolution2D)
from tests.functions.cuda_emulation import emulated_cuda  # noqa: F401

# (kernel, stride, pad, groups, in size)
KINDS = [(3, 1, 1, 1, 7), (3, 2, 1, 1, 8), (1, 1, 0, 1, 7), (1, 2, 0, 1, 7),
         (7, 2, 3, 1, 12), (3, 2, 1, 1, 14), (3, 1, 1, 2, 5)]


@pytest.mark.parametrize('kind', KINDS, ids=[
    'k{}s{}p{}g{}h{}'.format(*k) for k in KINDS])
def test_cuda_convolution_kernels_equal_bodies(
        kind, emulated_cuda):  # noqa: F811
    from minichain.kernels.cuda import im2col as cuda_conv
    k, s, p, groups, h = kind
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal((3, 4, h, h))
    W = rng.standard_normal((6, 4 // groups, k, k))
    oh = _geometry.conv_outsize(h, k, s, p)
    g = _geometry.Geometry(k, k, s, s, p, p, 1, 1, h, h, oh, oh)
    pair, pad = (s, s), (p, p)

    y = Convolution2D(pair, pad, False, (1, 1), groups).forward((x, W))[0]
    numpy.testing.assert_allclose(cuda_conv.conv_forward(x, W, g, groups), y,
                                  rtol=1e-12, atol=1e-12)
    gy = rng.standard_normal(y.shape)
    gw = Convolution2DGradW(W.shape, pair, pad, False, (1, 1),
                            groups).forward((x, gy))[0]
    numpy.testing.assert_allclose(
        cuda_conv.conv_grad_w(x, gy, g, groups, W.shape), gw, rtol=1e-12,
        atol=1e-11)
    gx = Deconvolution2D(pair, pad, (h, h), False, (1, 1),
                         groups).forward((gy, W))[0]
    numpy.testing.assert_allclose(cuda_conv.deconv_forward(gy, W, g, groups),
                                  gx, rtol=1e-12, atol=1e-12)
