"""The convolution nodes on CuPy: the columns of the whole batch built by
one CUDA kernel (``_elementwise.py``'s im2col, images after the kernel
offsets) and one cuBLAS product per group; col2im likewise.

The array functions take CuPy arrays (or NumPy ones under the tests' CUDA
emulation, ``tests/functions/cuda_emulation.py``); the node kernels below
them check the device and register.
"""
from minichain import backend, kernels
from minichain.functions import _geometry
from minichain.functions.convolution import (Col2Im, Convolution2D,
                                             Convolution2DGradW,
                                             Deconvolution2D, Im2Col)
from minichain.kernels.cuda import _elementwise


def _columns(x, g, groups):
    """(G, C/G*kh*kw, N*oh*ow): every image's columns side by side."""
    n = x.shape[0]
    col = _elementwise.im2col(x, g, batch_major=False)
    return col.reshape(groups, -1, n * g.oh * g.ow)


def _as_matrix(a, groups):
    """(N, C, h, w) -> (G, C/G, N*h*w), a copy with the images after the
    channels (the columns' order)."""
    xp = backend.get_array_module(a)
    n, c = a.shape[:2]
    return xp.ascontiguousarray(a.reshape(n, c, -1).transpose(1, 0, 2)
                                ).reshape(groups, c // groups, -1)


def _from_matrix(m, n):
    """(G, O/G, N*P) products -> a C-contiguous (N, O, P) array."""
    xp = backend.get_array_module(m)
    o = m.shape[0] * m.shape[1]
    return xp.ascontiguousarray(m.reshape(o, n, -1).transpose(1, 0, 2))


def conv_forward(x, W, g, groups):
    """y = conv(x, W) without bias."""
    xp = backend.get_array_module(x)
    n, o = x.shape[0], W.shape[0]
    prod = xp.matmul(W.reshape(groups, o // groups, -1),
                     _columns(x, g, groups))
    return _from_matrix(prod, n).reshape(n, o, g.oh, g.ow)


def conv_grad_w(x, gy, g, groups, w_shape):
    """dL/dW of y = conv(x, W) from x and gy."""
    xp = backend.get_array_module(x)
    col = _columns(x, g, groups)
    return xp.matmul(_as_matrix(gy, groups),
                     col.transpose(0, 2, 1)).reshape(w_shape)


def deconv_forward(x, W, g, groups):
    """The transpose of conv_forward: x (N, O, oh, ow) -> y (N, C, h, w)."""
    xp = backend.get_array_module(x)
    n, o = x.shape[:2]
    c = W.shape[1] * groups
    w2t = W.reshape(groups, o // groups, -1).transpose(0, 2, 1)
    col = xp.matmul(w2t, _as_matrix(x, groups))
    return _elementwise.col2im(col.reshape(c, g.kh, g.kw, n, g.oh, g.ow),
                               g, batch_major=False)


def _cupy(inputs):
    return all(type(a).__module__.startswith('cupy') for a in inputs)


def _geometry_of(node, k, in_size, out_size):
    return _geometry.Geometry(k[0], k[1], node.stride[0], node.stride[1],
                              node.pad[0], node.pad[1], node.dilate[0],
                              node.dilate[1], in_size[0], in_size[1],
                              out_size[0], out_size[1])


def convolution_2d(node, inputs):
    if not _cupy(inputs):
        return None
    x, W = inputs[:2]
    node.retain_inputs((0, 1))
    k = W.shape[2:]
    out = tuple(_geometry.conv_outsize(x.shape[2 + a], k[a], node.stride[a],
                                       node.pad[a], node.cover_all,
                                       node.dilate[a]) for a in (0, 1))
    y = conv_forward(x, W, _geometry_of(node, k, x.shape[2:], out),
                     node.groups)
    if len(inputs) == 3:
        y += inputs[2].reshape(1, -1, 1, 1)
    return y,


def deconvolution_2d(node, inputs):
    if not _cupy(inputs):
        return None
    x, W = inputs[:2]
    node.retain_inputs((0, 1))
    g = _geometry_of(node, W.shape[2:], node.outsize, x.shape[2:])
    y = deconv_forward(x, W, g, node.groups)
    if len(inputs) == 3:
        y += inputs[2].reshape(1, -1, 1, 1)
    return y,


def convolution_2d_grad_w(node, inputs):
    if not _cupy(inputs):
        return None
    x, gy = inputs
    node.retain_inputs((0, 1))
    g = _geometry_of(node, node.w_shape[2:], x.shape[2:], gy.shape[2:])
    return conv_grad_w(x, gy, g, node.groups, node.w_shape),


def im2col(node, inputs):
    x, = inputs
    if not _cupy(inputs):
        return None
    col = _elementwise.im2col(x, node.g, batch_major=True)
    return col.reshape(x.shape[0], -1, node.g.oh, node.g.ow),


def col2im(node, inputs):
    col, = inputs
    if not _cupy(inputs):
        return None
    g = node.g
    col = col.reshape(col.shape[0], -1, g.kh, g.kw, g.oh, g.ow)
    return _elementwise.col2im(col, g, batch_major=True),


kernels.register(Convolution2D, 'cuda', convolution_2d)
kernels.register(Deconvolution2D, 'cuda', deconvolution_2d)
kernels.register(Convolution2DGradW, 'cuda', convolution_2d_grad_w)
kernels.register(Im2Col, 'cuda', im2col)
kernels.register(Col2Im, 'cuda', col2im)
