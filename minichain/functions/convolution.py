"""Convolution: convolution_2d, deconvolution_2d, im2col (all NCHW).

The three convolution nodes differentiate into each other, so gradients of
any order exist: conv's gx is a deconvolution, its gW a
``Convolution2DGradW``, and GradW's own gradients are a convolution and a
deconvolution. Each body is the textbook im2col: the kh*kw windows of the
padded input as columns, and one matrix product per group; the fast
versions (chunked columns on threads, CUDA kernels) are kernels registered
for these nodes (``minichain/kernels``).
"""
from minichain import backend
from minichain.function_node import FunctionNode
from minichain.functions import geometry
from minichain.functions._check import (check_float, check_image,
                                        check_pair, check_same_dtype, unwrap)

__all__ = ['convolution_2d', 'deconvolution_2d', 'im2col']


def _geometry_of(k, stride, pad, dilate, in_size, out_size):
    return geometry.Geometry(k[0], k[1], stride[0], stride[1], pad[0],
                              pad[1], dilate[0], dilate[1], in_size[0],
                              in_size[1], out_size[0], out_size[1])


def _columns(x, g):
    """im2col: the windows of ``x`` (N, C, h, w) as a fresh
    (N, C, kh, kw, oh, ow) array, padding read as zeros."""
    xp = backend.get_array_module(x)
    xpad = geometry.padded(x, g)
    return xp.stack([xp.stack([geometry.window(xpad, g, ky, kx)
                               for kx in range(g.kw)], axis=2)
                     for ky in range(g.kh)], axis=2)


def _add_columns(col, g):
    """col2im, the adjoint of :func:`_columns`: (N, C, kh, kw, oh, ow)
    columns summed back into the pixels they read, (N, C, h, w)."""
    return geometry.spread(lambda ky, kx: col[:, :, ky, kx], g, col)


def _bias_sum(gy):
    from minichain.functions.reduction import sum as f_sum
    return f_sum(gy, axis=(0, 2, 3))


class Convolution2D(FunctionNode):
    """y = conv(x, W) + b; inputs (x, W) or (x, W, b)."""

    def __init__(self, stride, pad, cover_all, dilate, groups):
        self.stride, self.pad, self.dilate = stride, pad, dilate
        self.cover_all, self.groups = cover_all, groups

    def forward(self, inputs):
        self.retain_inputs((0, 1))
        x, W = inputs[:2]
        k = W.shape[2:]
        out = tuple(geometry.conv_outsize(
            x.shape[2 + a], k[a], self.stride[a], self.pad[a], self.cover_all,
            self.dilate[a]) for a in (0, 1))
        g = _geometry_of(k, self.stride, self.pad, self.dilate, x.shape[2:],
                         out)
        xp = backend.get_array_module(x)
        n, o, groups = x.shape[0], W.shape[0], self.groups
        # y[n, group] = W[group] (O/G, C/G*kh*kw) @ col[n, group]
        col = _columns(x, g).reshape(n, groups, -1, g.oh * g.ow)
        y = xp.matmul(W.reshape(groups, o // groups, -1), col)
        # astype: NumPy's matmul of ml_dtypes' bfloat16 returns float32
        y = y.reshape(n, o, g.oh, g.ow).astype(x.dtype, copy=False)
        if len(inputs) == 3:
            y += inputs[2].reshape(1, -1, 1, 1)  # y is fresh: safe in place
        return y,

    def backward(self, indexes, grad_outputs):
        x, W = self.get_retained_inputs()
        gy, = grad_outputs
        result = []
        for i in indexes:
            if i == 0:
                result.append(deconvolution_2d(
                    gy, W, stride=self.stride, pad=self.pad,
                    outsize=x.shape[2:], dilate=self.dilate,
                    groups=self.groups))
            elif i == 1:
                result.append(Convolution2DGradW(
                    W.shape, self.stride, self.pad, self.cover_all,
                    self.dilate, self.groups).apply((x, gy))[0])
            else:
                result.append(_bias_sum(gy))
        return tuple(result)


class Deconvolution2D(FunctionNode):
    """y = conv^T(x, W) + b: the adjoint of Convolution2D in its input."""

    def __init__(self, stride, pad, outsize, cover_all, dilate, groups):
        self.stride, self.pad, self.dilate = stride, pad, dilate
        self.outsize, self.cover_all, self.groups = outsize, cover_all, groups

    def forward(self, inputs):
        self.retain_inputs((0, 1))
        x, W = inputs[:2]
        g = _geometry_of(W.shape[2:], self.stride, self.pad, self.dilate,
                      self.outsize, x.shape[2:])
        xp = backend.get_array_module(x)
        n, o, groups = x.shape[0], W.shape[0], self.groups
        # The transpose of the convolution's product, then col2im.
        w2t = W.reshape(groups, o // groups, -1).swapaxes(1, 2)
        col = xp.matmul(w2t, x.reshape(n, groups, o // groups, -1)).astype(
            x.dtype, copy=False)   # bfloat16's float32 products, as above
        y = _add_columns(col.reshape(n, -1, g.kh, g.kw, g.oh, g.ow), g)
        if len(inputs) == 3:
            y += inputs[2].reshape(1, -1, 1, 1)
        return y,

    def backward(self, indexes, grad_outputs):
        x, W = self.get_retained_inputs()
        gy, = grad_outputs
        result = []
        for i in indexes:
            if i == 0:
                result.append(convolution_2d(
                    gy, W, stride=self.stride, pad=self.pad,
                    cover_all=self.cover_all, dilate=self.dilate,
                    groups=self.groups))
            elif i == 1:
                # The deconvolution's input plays the conv's output role.
                result.append(Convolution2DGradW(
                    W.shape, self.stride, self.pad, self.cover_all,
                    self.dilate, self.groups).apply((gy, x))[0])
            else:
                result.append(_bias_sum(gy))
        return tuple(result)


class Convolution2DGradW(FunctionNode):
    """gW = dL/dW of a convolution, from its input x and its output grad gy.

    gW is bilinear in (x, gy), so its gradients are again a deconvolution
    (for x) and a convolution (for gy) with the incoming ggW as weight.
    """

    def __init__(self, w_shape, stride, pad, cover_all, dilate, groups):
        self.w_shape = tuple(w_shape)
        self.stride, self.pad, self.dilate = stride, pad, dilate
        self.cover_all, self.groups = cover_all, groups

    def forward(self, inputs):
        self.retain_inputs((0, 1))
        x, gy = inputs
        g = _geometry_of(self.w_shape[2:], self.stride, self.pad, self.dilate,
                      x.shape[2:], gy.shape[2:])
        xp = backend.get_array_module(x)
        n, o, groups = x.shape[0], gy.shape[1], self.groups
        # gW[group] = sum over images and pixels of gy[n, group] col^T
        col = _columns(x, g).reshape(n, groups, -1, g.oh * g.ow)
        gy2 = gy.reshape(n, groups, o // groups, -1)
        gw = xp.stack([xp.tensordot(gy2[:, i], col[:, i], ((0, 2), (0, 2)))
                       for i in range(groups)])
        return gw.reshape(self.w_shape).astype(x.dtype, copy=False),

    def backward(self, indexes, grad_outputs):
        x, gy = self.get_retained_inputs()
        ggw, = grad_outputs
        result = []
        for i in indexes:
            if i == 0:
                result.append(deconvolution_2d(
                    gy, ggw, stride=self.stride, pad=self.pad,
                    outsize=x.shape[2:], dilate=self.dilate,
                    groups=self.groups))
            else:
                result.append(convolution_2d(
                    x, ggw, stride=self.stride, pad=self.pad,
                    cover_all=self.cover_all, dilate=self.dilate,
                    groups=self.groups))
        return tuple(result)


def _check_inputs(func, x, W, b, groups):
    xa, Wa = check_image(func, x), check_float(func, W, 'W')
    if Wa.ndim != 4:
        raise ValueError('{}: W must be 4-D, got shape {}'
                         .format(func, Wa.shape))
    arrays = [xa, Wa]
    if b is not None:
        ba = check_float(func, b, 'b')
        arrays.append(ba)
    check_same_dtype(func, *arrays)
    if len({backend.get_array_module(a) for a in arrays}) > 1:
        raise TypeError('{}: x, W and b must all live on the CPU or all on '
                        'the GPU'.format(func))
    if int(groups) != groups or groups < 1:
        raise ValueError('{}: groups must be a positive int, got {!r}'
                         .format(func, groups))
    return xa, Wa


def _check_bias(func, b, channels):
    if b is not None and unwrap(b).shape != (channels,):
        raise ValueError('{}: b must have shape ({},) (one per output '
                         'channel), got {}'.format(func, channels,
                                                   unwrap(b).shape))


def convolution_2d(x, W, b=None, stride=1, pad=0, cover_all=False, dilate=1,
                   groups=1):
    """Two-dimensional convolution (cross-correlation, as in Chainer).

    With G = groups, C_g = C/G channels per group and g(o) the group of
    output channel o:
    ``y[n, o, i, j] = b[o] + sum_{c<C_g, ky, kx} W[o, c, ky, kx] *
    x_pad[n, g(o)*C_g + c, i*sy + ky*dy, j*sx + kx*dx]``
    where x_pad is x padded with ph/pw zeros. A 1x1 stride-1 convolution is
    a plain matrix product over the channels.

    Args:
        x: (N, C, H, W) input.
        W: (O, C/groups, kh, kw) filters.
        b: optional (O,) bias.
        stride, pad, dilate: an int or a pair (vertical, horizontal).
        cover_all: add windows so that every input pixel is covered (the
            output then may read past the padding, where x counts as 0).
        groups: split channels into this many independent convolutions.
    Returns:
        Variable of shape (N, O, out_h, out_w) with
        ``out_h = (H + 2*ph - (kh-1)*dy - 1) // sy + 1`` (plus ``sy - 1`` in
        the numerator when cover_all).
    Raises:
        ValueError naming the shapes when ranks, channels, groups, bias or
        the kernel size (larger than the padded input) do not fit;
        TypeError for non-float or mismatched dtypes.
    """
    func = 'convolution_2d'
    xa, Wa = _check_inputs(func, x, W, b, groups)
    stride = check_pair(func, 'stride', stride, 1)
    pad = check_pair(func, 'pad', pad, 0)
    dilate = check_pair(func, 'dilate', dilate, 1)
    n, c, h, w = xa.shape
    o, cg, kh, kw = Wa.shape
    if c % groups or o % groups:
        raise ValueError('{}: groups={} must divide both the channels of x '
                         '(shape {}) and the out channels of W (shape {})'
                         .format(func, groups, xa.shape, Wa.shape))
    if cg * groups != c:
        raise ValueError('{}: x has {} channels (shape {}) but W of shape {} '
                         'with groups={} expects {}'.format(
                             func, c, xa.shape, Wa.shape, groups, cg * groups))
    _check_bias(func, b, o)
    ek = ((kh - 1) * dilate[0] + 1, (kw - 1) * dilate[1] + 1)
    if ek[0] > h + 2 * pad[0] or ek[1] > w + 2 * pad[1]:
        raise ValueError('{}: the kernel ({}x{}, dilated extent {}x{}) is '
                         'larger than the padded input ({}x{}): x shape {}, W '
                         'shape {}, pad {}, dilate {}'.format(
                             func, kh, kw, ek[0], ek[1], h + 2 * pad[0],
                             w + 2 * pad[1], xa.shape, Wa.shape, pad, dilate))
    node = Convolution2D(stride, pad, bool(cover_all), dilate, int(groups))
    inputs = (x, W) if b is None else (x, W, b)
    return node.apply(inputs)[0]


def deconvolution_2d(x, W, b=None, stride=1, pad=0, outsize=None, dilate=1,
                     groups=1):
    """Two-dimensional deconvolution (transposed convolution), NCHW.

    The adjoint of :func:`convolution_2d` in its input: if
    ``y = convolution_2d(z, W)`` maps (N, C_out, H, W) to (N, C_in, h, w),
    then ``deconvolution_2d(x, W)`` maps (N, C_in, h, w) back to
    (N, C_out, H, W), scattering ``x[n, i, y, x] * W[i, c, ky, kx]`` to
    output pixel ``(y*sy + ky*dy - ph, x*sx + kx*dx - pw)``.

    Args:
        x: (N, C_in, h, w) input.
        W: (C_in, C_out/groups, kh, kw) filters (Chainer's layout).
        b: optional (C_out,) bias.
        stride, pad, dilate: an int or a pair.
        outsize: (H, W) of the output; by default
            ``(h - 1)*sy + (kh - 1)*dy + 1 - 2*ph``. Any size that a
            convolution (with or without cover_all) maps back to (h, w)
            is accepted.
        groups: number of channel groups.
    Returns:
        Variable of shape (N, C_out, H, W).
    Raises:
        ValueError naming the shapes for mismatched channels, groups, bias
        or an outsize that does not invert to x's size.
    """
    func = 'deconvolution_2d'
    xa, Wa = _check_inputs(func, x, W, b, groups)
    stride = check_pair(func, 'stride', stride, 1)
    pad = check_pair(func, 'pad', pad, 0)
    dilate = check_pair(func, 'dilate', dilate, 1)
    n, c, h, w = xa.shape
    ci, cog, kh, kw = Wa.shape
    if ci != c:
        raise ValueError('{}: x has {} channels (shape {}) but W has shape {} '
                         '(in channels first)'.format(func, c, xa.shape,
                                                      Wa.shape))
    if c % groups:
        raise ValueError('{}: groups={} must divide the channels of x (shape '
                         '{})'.format(func, groups, xa.shape))
    _check_bias(func, b, cog * groups)
    k = (kh, kw)
    if outsize is None:
        outsize = tuple(geometry.deconv_outsize(xa.shape[2 + a], k[a],
                                                 stride[a], pad[a], False,
                                                 dilate[a]) for a in (0, 1))
    outsize = check_pair(func, 'outsize', outsize, 1)
    fits = [all(geometry.conv_outsize(outsize[a], k[a], stride[a], pad[a],
                                       cover, dilate[a]) == xa.shape[2 + a]
                for a in (0, 1)) for cover in (False, True)]
    if not any(fits):
        raise ValueError('{}: outsize {} is not a size that a convolution '
                         '(kernel {}, stride {}, pad {}, dilate {}) maps to '
                         'x\'s spatial size {} (x shape {})'.format(
                             func, outsize, k, stride, pad, dilate,
                             xa.shape[2:], xa.shape))
    node = Deconvolution2D(stride, pad, outsize, not fits[0], dilate,
                           int(groups))
    inputs = (x, W) if b is None else (x, W, b)
    return node.apply(inputs)[0]


class Im2Col(FunctionNode):
    def __init__(self, g):
        self.g = g

    def forward(self, inputs):
        x, = inputs
        col = _columns(x, self.g)
        return col.reshape(x.shape[0], -1, self.g.oh, self.g.ow),

    def backward(self, indexes, grad_outputs):
        return Col2Im(self.g).apply(grad_outputs)


class Col2Im(FunctionNode):
    """The adjoint of Im2Col: sums columns back into pixels."""

    def __init__(self, g):
        self.g = g

    def forward(self, inputs):
        col, = inputs
        g = self.g
        col = col.reshape(col.shape[0], -1, g.kh, g.kw, g.oh, g.ow)
        return _add_columns(col, g),

    def backward(self, indexes, grad_outputs):
        return Im2Col(self.g).apply(grad_outputs)


def im2col(x, ksize, stride=1, pad=0, cover_all=False, dilate=1):
    """Extract the convolution windows of ``x`` as channels.

    ``col[n, (c*kh + ky)*kw + kx, i, j] = x_pad[n, c, i*sy + ky*dy,
    j*sx + kx*dx]`` (zero padding), so ``convolution_2d(x, W)`` equals
    ``W.reshape(O, -1) @ col`` over the second axis.

    Args:
        x: (N, C, H, W) input.
        ksize, stride, pad, dilate: an int or a pair.
        cover_all: as in :func:`convolution_2d`.
    Returns:
        Variable of shape (N, C*kh*kw, out_h, out_w) (layout: channel major,
        then kernel row, then kernel column).
    """
    func = 'im2col'
    xa = check_image(func, x)
    k = check_pair(func, 'ksize', ksize, 1)
    stride = check_pair(func, 'stride', stride, 1)
    pad = check_pair(func, 'pad', pad, 0)
    dilate = check_pair(func, 'dilate', dilate, 1)
    out = tuple(geometry.conv_outsize(xa.shape[2 + a], k[a], stride[a],
                                       pad[a], cover_all, dilate[a])
                for a in (0, 1))
    if min(out) < 1:
        raise ValueError('{}: the window ({}, dilate {}) is larger than the '
                         'padded input (x shape {}, pad {})'.format(
                             func, k, dilate, xa.shape, pad))
    g = _geometry_of(k, stride, pad, dilate, xa.shape[2:], out)
    return Im2Col(g).apply((x,))[0]


def _convolution_2d_composite(x, W, b=None, stride=1, pad=0, cover_all=False,
                              dilate=1, groups=1):
    """Reference convolution_2d made only of F functions (im2col + matmul).

    Slower and hungrier than the fused node; tests check that both agree.
    """
    from minichain.functions.array import reshape
    from minichain.functions.basic_math import matmul
    n = unwrap(x).shape[0]
    o, cg, kh, kw = unwrap(W).shape
    col = im2col(x, (kh, kw), stride, pad, cover_all, dilate)
    _, _, oh, ow = col.shape
    col = reshape(col, (n, groups, cg * kh * kw, oh * ow))
    y = matmul(reshape(W, (groups, o // groups, cg * kh * kw)), col)
    y = reshape(y, (n, o, oh, ow))
    if b is not None:
        y = y + reshape(b, (1, o, 1, 1))
    return y
