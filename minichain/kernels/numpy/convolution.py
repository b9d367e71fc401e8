"""The convolution nodes on NumPy: chunked im2col + GEMM on minichain's
threads, channel-major outputs, 1x1 products read in place
(``_im2col.py`` has the routes and the figures behind them)."""
import numpy

from minichain import kernels
from minichain.functions import _geometry
from minichain.functions.convolution import (Convolution2D,
                                             Convolution2DGradW,
                                             Deconvolution2D)
from minichain.kernels.numpy import _im2col


def _numpy(inputs):
    # ml_dtypes' bfloat16 (kind 'V'): the body's, which casts NumPy's
    # float32 products back
    return all(isinstance(a, numpy.ndarray) and a.dtype.kind != 'V'
               for a in inputs)


def _geometry_of(node, k, in_size, out_size):
    return _geometry.Geometry(k[0], k[1], node.stride[0], node.stride[1],
                              node.pad[0], node.pad[1], node.dilate[0],
                              node.dilate[1], in_size[0], in_size[1],
                              out_size[0], out_size[1])


def convolution_2d(node, inputs):
    if not _numpy(inputs):
        return None
    x, W = inputs[:2]
    node.retain_inputs((0, 1))
    k = W.shape[2:]
    out = tuple(_geometry.conv_outsize(x.shape[2 + a], k[a], node.stride[a],
                                       node.pad[a], node.cover_all,
                                       node.dilate[a]) for a in (0, 1))
    g = _geometry_of(node, k, x.shape[2:], out)
    y = _im2col.conv_forward(x, W, g, node.groups)
    if len(inputs) == 3:
        y += inputs[2].reshape(1, -1, 1, 1)
    return y,


def deconvolution_2d(node, inputs):
    if not _numpy(inputs):
        return None
    x, W = inputs[:2]
    node.retain_inputs((0, 1))
    g = _geometry_of(node, W.shape[2:], node.outsize, x.shape[2:])
    y = _im2col.deconv_forward(x, W, g, node.groups)
    if len(inputs) == 3:
        y += inputs[2].reshape(1, -1, 1, 1)
    return y,


def convolution_2d_grad_w(node, inputs):
    if not _numpy(inputs):
        return None
    x, gy = inputs
    node.retain_inputs((0, 1))
    g = _geometry_of(node, node.w_shape[2:], x.shape[2:], gy.shape[2:])
    return _im2col.conv_grad_w(x, gy, g, node.groups, node.w_shape),


kernels.register(Convolution2D, 'numpy', convolution_2d)
kernels.register(Deconvolution2D, 'numpy', deconvolution_2d)
kernels.register(Convolution2DGradW, 'numpy', convolution_2d_grad_w)
