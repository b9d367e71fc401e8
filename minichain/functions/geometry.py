"""Convolution geometry, shared by the convolution and pooling ops and
their kernels.

A convolution maps an input of spatial size (h, w) to (oh, ow): output
pixel (i, j) with kernel offset (ky, kx) reads input pixel
(i*sy + ky*dy - ph, j*sx + kx*dx - pw); pixels outside the input read 0.
The ops' bodies pad the input (:func:`padded`) and read one strided
:func:`window` per kernel offset.
"""
import collections

from minichain import backend

Geometry = collections.namedtuple(
    'Geometry', 'kh kw sy sx ph pw dy dx h w oh ow')


def conv_outsize(size, k, s, p, cover_all=False, d=1):
    """Output length of a convolution along one axis (Chainer's formula)."""
    dk = k + (k - 1) * (d - 1)
    if cover_all:
        return (size + p * 2 - dk + s - 1) // s + 1
    return (size + p * 2 - dk) // s + 1


def deconv_outsize(size, k, s, p, cover_all=False, d=1):
    """Output length of a deconvolution: the inverse of :func:`conv_outsize`."""
    dk = (k - 1) * d + 1
    if cover_all:
        return s * (size - 1) + dk - s + 1 - 2 * p
    return s * (size - 1) + dk - 2 * p


def is_pointwise(g):
    """A 1x1, stride-1, unpadded convolution: the columns are the input."""
    return (g.kh == g.kw == g.sy == g.sx == 1 and g.ph == g.pw == 0
            and (g.oh, g.ow) == (g.h, g.w))


def _axis_range(ko, s, p, size, osize):
    """Output positions i (range i0..i1) whose input i*s + ko - p is inside."""
    i0 = max(0, -((ko - p) // s))
    i1 = min(osize, (size - 1 + p - ko) // s + 1)
    return i0, max(i0, i1), i0 * s + ko - p


def window_slices(g):
    """Yield (ky, kx, out_index, in_index) for every kernel offset.

    ``out[..., out_index]`` and ``x[..., in_index]`` are the output positions
    and the input pixels that offset (ky, kx) pairs, clipped to the input, so
    padding never needs to be materialised. Offsets reaching only padding
    are skipped.
    """
    for ky in range(g.kh):
        i0, i1, r0 = _axis_range(ky * g.dy, g.sy, g.ph, g.h, g.oh)
        if i1 == i0:
            continue
        for kx in range(g.kw):
            j0, j1, c0 = _axis_range(kx * g.dx, g.sx, g.pw, g.w, g.ow)
            if j1 == j0:
                continue
            out_index = (Ellipsis, slice(i0, i1), slice(j0, j1))
            in_index = (Ellipsis,
                        slice(r0, r0 + (i1 - i0 - 1) * g.sy + 1, g.sy),
                        slice(c0, c0 + (j1 - j0 - 1) * g.sx + 1, g.sx))
            yield ky, kx, out_index, in_index


def padded(x, g, value=0):
    """``x`` (..., h, w) inside a fresh array filled with ``value``: ``ph``
    rows above and ``pw`` columns left, and below and right as far as the
    windows reach (at least to x's last pixel, so that an adjoint can crop
    x's pixels back out of it: ``[..., ph:ph + h, pw:pw + w]``)."""
    xp = backend.get_array_module(x)
    hp = max((g.oh - 1) * g.sy + (g.kh - 1) * g.dy + 1, g.ph + g.h)
    wp = max((g.ow - 1) * g.sx + (g.kw - 1) * g.dx + 1, g.pw + g.w)
    out = xp.full(x.shape[:-2] + (hp, wp), value, x.dtype)
    out[..., g.ph:g.ph + g.h, g.pw:g.pw + g.w] = x
    return out


def window(a, g, ky, kx):
    """The (..., oh, ow) view of a :func:`padded` array that kernel offset
    (ky, kx) reads: pixel (i*sy + ky*dy, j*sx + kx*dx) for output (i, j)."""
    y0, x0 = ky * g.dy, kx * g.dx
    return a[..., y0:y0 + (g.oh - 1) * g.sy + 1:g.sy,
             x0:x0 + (g.ow - 1) * g.sx + 1:g.sx]


def crop(a, g):
    """The input's pixels out of a :func:`padded`-shaped array."""
    return a[..., g.ph:g.ph + g.h, g.pw:g.pw + g.w]


def spread(parts, g, like):
    """The adjoint of reading windows: ``parts(ky, kx)`` (N, C, oh, ow)
    added into the pixels that offset (ky, kx) read; a fresh (N, C, h, w)
    array of ``like``'s dtype and device."""
    xp = backend.get_array_module(like)
    acc = padded(xp.zeros(like.shape[:2] + (g.h, g.w), like.dtype), g)
    for ky in range(g.kh):
        for kx in range(g.kw):
            win = window(acc, g, ky, kx)
            win += parts(ky, kx)
    return xp.ascontiguousarray(crop(acc, g))
