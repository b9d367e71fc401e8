"""Convolution columns with the images last, for the CPU's small maps.

``_im2col.py`` builds a chunk's columns in the order (image, row, column):
``col[(c, ky, kx), (n, y, x)]``. Copying them out of the padded input
moves one run of ``ow`` values per (c, ky, kx, n, y), and at ResNet-50's
small maps (14x14 down to 2x2) NumPy's per-run cost, not the bytes,
sets the time: 300,000 runs of 2 to 14 values per 3x3 convolution of a
batch of 32.

Here the chunk is first padded into a (C, H, W, B) copy, images last;
then a window (c, ky, kx, y) is one run of ``ow * B`` values, a few
thousand runs per convolution. The columns come out in the order
(row, column, image), so what multiplies them (gy for the weight
gradient) is gathered in that order too, and the product is scattered
back into the (N, C, oh, ow) result. Those two reorderings touch the
output once, where the columns are kh*kw times the input.

The same order serves a deconvolution (a convolution's input gradient)
that sums its columns back into pixels (:func:`add_columns`): a window's
sum into the (C, H, W, B) pixels is one run of ``ow * B`` values per
(c, y) at stride 1, and of ``B`` at stride 2, where the usual (N, C, H,
W) pixels take runs of ``ow`` or single values.
"""
import numpy

from minichain.kernels.numpy import _parallel


def windows_extent(g):
    """Rows and columns of the padded input that the windows reach, and how
    many of them are input pixels."""
    ext_h = (g.oh - 1) * g.sy + (g.kh - 1) * g.dy + 1
    ext_w = (g.ow - 1) * g.sx + (g.kw - 1) * g.dx + 1
    hh = max(0, min(g.h, ext_h - g.ph))
    ww = max(0, min(g.w, ext_w - g.pw))
    return ext_h, ext_w, hh, ww


def columns(x, g, n0, n1):
    """Images n0..n1 of ``x`` (N, C, h, w), any strides, as their columns
    (C*kh*kw, oh*ow*B), columns in (y, x, image) order, in this thread's
    workspace (reused: valid until its next call)."""
    c, b = x.shape[1], n1 - n0
    ext_h, ext_w, hh, ww = windows_extent(g)
    xp = _parallel.workspace('pad_last', (c, ext_h, ext_w, b), x.dtype)
    xp[:, :g.ph] = 0
    xp[:, g.ph + hh:] = 0
    xp[:, :, :g.pw] = 0
    xp[:, :, g.pw + ww:] = 0
    xp[:, g.ph:g.ph + hh, g.pw:g.pw + ww] = \
        x[n0:n1, :, :hh, :ww].transpose(1, 2, 3, 0)
    col = _parallel.workspace('col_last', (c, g.kh, g.kw, g.oh, g.ow, b),
                              x.dtype)
    for ky in range(g.kh):
        y0 = ky * g.dy
        for kx in range(g.kw):
            x0 = kx * g.dx
            col[:, ky, kx] = xp[:, y0:y0 + (g.oh - 1) * g.sy + 1:g.sy,
                                x0:x0 + (g.ow - 1) * g.sx + 1:g.sx]
    return col.reshape(c * g.kh * g.kw, -1)


def gather(a, n0, n1, name):
    """Images n0..n1 of ``a`` (N, O, oh, ow), any strides, as a (O,
    oh*ow*B) matrix in the columns' order (:func:`columns`), in this
    thread's workspace ``name``."""
    out = _parallel.workspace(name, a.shape[1:] + (n1 - n0,), a.dtype)
    numpy.copyto(out, a[n0:n1].transpose(1, 2, 3, 0))
    return out.reshape(a.shape[1], -1)


def scatter(y, n0, n1, prod):
    """Write ``prod`` (O, oh*ow*B), columns in (y, x, image) order, into
    images n0..n1 of ``y`` (N, O, oh, ow)."""
    o, oh, ow = y.shape[1:]
    numpy.copyto(y[n0:n1].transpose(1, 2, 3, 0),
                 prod.reshape(o, oh, ow, n1 - n0))


def add_columns(col, y, g, n0, n1):
    """Sum the columns ``col`` (C*kh*kw, oh*ow*B), columns in (y, x,
    image) order, back into pixels, written into images n0..n1 of ``y``
    (N, C, h, w), any strides: the adjoint of :func:`columns`.

    The padded pixels are kept as their sy*sx stride phases (C, sy, sx,
    rows, cols, B) (``_phase_grid.py`` does the same for pooling), so that
    every window adds one run of ``ow * B`` values per (c, y) at any
    stride; only the final copy into y steps over every sy-th pixel.
    """
    c, b = y.shape[1], n1 - n0
    taps = [[divmod(k * d, s) for k in range(n)]
            for n, d, s in ((g.kh, g.dy, g.sy), (g.kw, g.dx, g.sx))]
    rows = max(g.oh + taps[0][-1][0], -(-(g.ph + g.h) // g.sy))
    cols = max(g.ow + taps[1][-1][0], -(-(g.pw + g.w) // g.sx))
    yp = _parallel.workspace('phases', (c, g.sy, g.sx, rows, cols, b),
                             y.dtype)
    yp[...] = 0
    col = col.reshape(c, g.kh, g.kw, g.oh, g.ow, b)
    for ky, (t, a) in enumerate(taps[0]):
        for kx, (u, e) in enumerate(taps[1]):
            dst = yp[:, a, e, t:t + g.oh, u:u + g.ow]
            numpy.add(dst, col[:, ky, kx], out=dst)
    out = y[n0:n1].transpose(1, 2, 3, 0)  # (C, h, w, B)
    for a in range(g.sy):
        r0 = (a - g.ph) % g.sy  # the first row of y in phase a
        for e in range(g.sx):
            q0 = (e - g.pw) % g.sx
            src = yp[:, a, e, (r0 + g.ph) // g.sy:, (q0 + g.pw) // g.sx:]
            dst = out[:, r0::g.sy, q0::g.sx]
            numpy.copyto(dst, src[:, :dst.shape[1], :dst.shape[2]])
