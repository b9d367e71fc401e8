"""A strided 1x1 convolution (ResNet's projection shortcuts) as a
pointwise one over the pixels it reads.

A 1x1 window with stride (sy, sx) and no padding reads only every sy-th
row and sx-th column: the convolution is ``W @ x[:, :, ::sy, ::sx]``, its
weight gradient ``gy @ x[:, :, ::sy, ::sx]^T``, and its input gradient
``W^T @ gy`` spread into those pixels (zeros elsewhere). Taking those
pixels once into a channel-major array (``_layout.py``) makes every one a
single in-place product; the general route copies the whole input into
padded images-last or windowed columns first, four times the pixels at
stride 2. CPU only: the GPU's column kernels read the strided pixels as
cheaply.
"""
import numpy

from minichain.kernels.numpy import _layout


def fits(g):
    """Whether ``g`` (``_im2col.Geometry``) is a 1x1, unpadded, strided
    window."""
    return (g.kh == g.kw == 1 and g.ph == g.pw == 0
            and (g.sy, g.sx) != (1, 1))


def geometry(g):
    """The pointwise geometry over the (oh, ow) pixels ``g`` reads."""
    return g._replace(sy=1, sx=1, h=g.oh, w=g.ow)


def _taken(a, g):
    """The view of pixels that ``g``'s windows read, (N, C, <=oh, <=ow)
    (cover_all's last window may start past the input)."""
    return a[:, :, ::g.sy, ::g.sx][:, :, :g.oh, :g.ow]


def take(x, g):
    """The pixels of ``x`` (N, C, h, w) that ``g`` reads, as a fresh
    channel-major (N, C, oh, ow) array; zeros for windows past the input."""
    src = _taken(x, g)
    zeros = src.shape[2:] != (g.oh, g.ow)
    out = (_layout.zeros_channel_major if zeros else
           _layout.empty_channel_major)(x.shape[:2] + (g.oh, g.ow), x.dtype)
    numpy.copyto(out[:, :, :src.shape[2], :src.shape[3]], src)
    return out


def spread(ys, g):
    """``ys`` (N, C, oh, ow) written into the pixels that ``g`` reads of a
    fresh channel-major (N, C, h, w) array of zeros."""
    y = _layout.zeros_channel_major(ys.shape[:2] + (g.h, g.w), ys.dtype)
    dst = _taken(y, g)
    numpy.copyto(dst, ys[:, :, :dst.shape[2], :dst.shape[3]])
    return y
