"""Convolution geometry, shared by the convolution and pooling kernels.

A convolution maps an input of spatial size (h, w) to (oh, ow): output
pixel (i, j) with kernel offset (ky, kx) reads input pixel
(i*sy + ky*dy - ph, j*sx + kx*dx - pw); pixels outside the input read 0.
"""
import collections

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
