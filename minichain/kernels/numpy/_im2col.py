"""Array-level convolution kernels: im2col, col2im and the chunked GEMMs.

Everything here works on raw NumPy arrays; the kernels of the convolution
nodes (``convolution.py`` beside this file) call it. The geometry
(``Geometry``, the output sizes, the window slices) lives in
``functions/geometry.py``, which the ops' bodies share.

Column layouts. ``im2col`` (the public one) returns (N, C, kh, kw, oh, ow).
The GEMM path builds *chunks* of B images in the layout (C, kh, kw, B, oh, ow),
so that one matrix product ``W (O, C*kh*kw) @ col (C*kh*kw, B*oh*ow)`` covers
the chunk. On the CPU the batch is cut into chunks whose columns fit in the
cache (a small col buffer reused across calls never page-faults); when
oh*ow is large a chunk is one image and the product writes straight into
the NCHW output, with no transposition at all, and an image whose columns
are still too big is built and multiplied in bands of output rows. The
chunks are shared out over the kernel's threads (``_parallel.over_chunks``;
``conv_forward``, ``conv_grad_w`` and ``deconv_forward`` run inside
:func:`minichain.host.cpu_kernel_scope`). The GPU's version (one chunk
holding the whole batch) is ``kernels/cuda/im2col.py``.

Transposing a large matrix in NumPy costs 1-4 ns per element (a 2048x512
weight: ~4 ms, as long as its GEMM), so the products take transposed
operands as views (BLAS reads them in place) and only small chunks are
ever reordered.
"""
import numpy
from numpy.lib.stride_tricks import as_strided

from minichain import backend, host
from minichain.kernels.numpy import (_batch_last, _conv_matrices, _parallel,
                                     _strided_pointwise)
from minichain.functions.geometry import (  # noqa: F401  (shared names)
    Geometry, conv_outsize, deconv_outsize, is_pointwise, window_slices)

# Columns of one chunk: at least this many for an efficient GEMM (OpenBLAS
# nears its peak from a few hundred columns; bigger chunks cost
# transpositions) ...
_MIN_COLUMNS = 512
# ... and a col chunk of at most this many bytes, so that it stays in L3.
_CHUNK_BYTES = 8 << 20
# With several threads, chunks of at least this many columns: every chunk
# costs about ten NumPy calls, and threads take turns at Python's lock
# between calls. On 2 threads the ResNet-50 step of the main job ran 3-4%
# faster with 2048 than with 512, on 1 thread 4% slower (2026-12-01).
_MIN_COLUMNS_THREADED = 2048
# conv_grad_w computes gW^T when its product sums at least this many columns.
_FLIP_MIN_COLUMNS = 4096
# One image's columns above this many bytes are built and multiplied in
# bands of output rows, so that a band is still in cache when its product
# reads it (an image at 224 px has up to 7 MiB of columns). The figures
# behind these constants: bench/README.md.
_BAND_BYTES = 2 << 20
# Images-last columns (_batch_last.py) for maps at most this wide, in
# chunks of at least this many images: at 14x14 and wider, or in smaller
# chunks, the usual columns copied as fast.
_BATCH_LAST_MAX_WIDTH = 7
_BATCH_LAST_MIN_IMAGES = 8


_workspace = _parallel.workspace


def _padded_windows(x, g, ws_name=None):
    """A strided view (B, C, kh, kw, oh, ow) of ``x`` padded with zeros.

    The zero-padded copy goes to a workspace when ``ws_name`` is given; it
    keeps the order of x's memory (a channel-major x, whose batch stride
    is the smaller one, is padded as (C, B, ...) planes).
    """
    ext_h, ext_w, hh, ww = _batch_last.windows_extent(g)
    swap = x.strides[0] < x.strides[1]
    planes = x.swapaxes(0, 1) if swap else x
    if g.ph == g.pw == 0 and ext_h <= g.h and ext_w <= g.w:
        xp = planes
    else:
        shape = planes.shape[:2] + (ext_h, ext_w)
        if ws_name is None:
            xp = numpy.zeros(shape, x.dtype)
        else:
            xp = _workspace(ws_name, shape, x.dtype)
            xp[:, :, :g.ph] = 0
            xp[:, :, g.ph + hh:] = 0
            xp[:, :, :, :g.pw] = 0
            xp[:, :, :, g.pw + ww:] = 0
        xp[:, :, g.ph:g.ph + hh, g.pw:g.pw + ww] = planes[:, :, :hh, :ww]
    s = xp.strides
    win = as_strided(xp, xp.shape[:2] + (g.kh, g.kw, g.oh, g.ow),
                     (s[0], s[1], s[2] * g.dy, s[3] * g.dx,
                      s[2] * g.sy, s[3] * g.sx), writeable=False)
    return win.swapaxes(0, 1) if swap else win


# -- public layout (N, C, kh, kw, oh, ow) -------------------------------------
def im2col(x, g):
    """Columns of ``x`` (N, C, h, w) as a fresh (N, C, kh, kw, oh, ow) array."""
    return numpy.ascontiguousarray(_padded_windows(x, g))


def col2im(col, g):
    """Sum (N, C, kh, kw, oh, ow) columns back into a fresh (N, C, h, w)."""
    out = numpy.zeros(col.shape[:2] + (g.h, g.w), col.dtype)
    _col2im_add(out, col, g)
    return out


def _col2im_add(out, col, g):
    """out (B, C, h, w) += the columns (B, C, kh, kw, oh, ow), any strides."""
    for ky, kx, o_idx, i_idx in window_slices(g):
        dst = out[i_idx]
        numpy.add(dst, col[:, :, ky, kx][o_idx], out=dst)


# -- chunked GEMM kernels ----------------------------------------------------
def _chunks(xp, n, per_image_bytes, p, in_place=()):
    """Split range(n) into chunks of images for the column GEMMs; by
    :func:`_view_chunks` where the operands ``in_place`` ((array, groups)
    pairs) are all matrices that BLAS reads in place
    (``_conv_matrices.matrix``)."""
    if xp is not numpy:
        return [(0, n)]
    if in_place and all(_conv_matrices.matrix(a, 0, n, groups) is not None
                        for a, groups in in_place):
        return _view_chunks(n, p)
    threads = _parallel.product_threads()
    columns = _MIN_COLUMNS if threads < 2 else _MIN_COLUMNS_THREADED
    b = max(1, min(n, -(-columns // p),
                   _CHUNK_BYTES // max(1, per_image_bytes)))
    count = -(-n // b)
    # Every thread gets the same number of chunks (each thread takes a run
    # of them, see _parallel.over_chunks).
    if 1 < threads <= n:
        count = min(n, -(-count // threads) * threads)
    b = -(-n // count)  # balance the chunks
    return [(i, min(n, i + b)) for i in range(0, n, b)]


def _view_chunks(n, p):
    """Chunks for products whose operands are all views (no columns to
    build): one run of images per thread while each keeps _MIN_COLUMNS
    columns, else the whole batch in one product, which
    ``_parallel.matmul`` then cuts into row blocks."""
    threads = min(_parallel.product_threads(), n)
    if threads < 2 or n * p < threads * _MIN_COLUMNS:
        return [(0, n)]
    return [(n * i // threads, n * (i + 1) // threads)
            for i in range(threads)]


def _column_builder(x, g):
    """``cols(n0, n1, rows)``: the columns of images n0..n1 as a
    (C*kh*kw, B*oh*ow) matrix, or with ``rows = (r0, r1)`` (one image)
    those of output rows r0..r1 only. The padded copy of an image is kept
    for its next band; make one builder per thread and call."""
    c = x.shape[1]
    k = c * g.kh * g.kw
    last = [None, None]  # images (n0, n1) and their padded windows

    def cols(n0, n1, rows):
        b = n1 - n0
        if is_pointwise(g):
            m = _conv_matrices.matrix(x, n0, n1, 1)
            if m is not None:  # the input itself, read in place
                return m[0]
        if last[0] != (n0, n1):
            last[:] = (n0, n1), _padded_windows(x[n0:n1], g, 'pad')
        r0, r1 = rows or (0, g.oh)
        col = _workspace('col', (c, g.kh, g.kw, b, r1 - r0, g.ow), x.dtype)
        numpy.copyto(col, last[1][..., r0:r1, :].transpose(1, 2, 3, 0, 4, 5))
        return col.reshape(k, b * (r1 - r0) * g.ow)
    return cols


def _bands(xp, chunks, g, col_bytes_per_row):
    """The chunks as (n0, n1, rows): one image whose columns exceed
    _BAND_BYTES is cut into bands of output rows ``rows = (r0, r1)``;
    anything else keeps ``rows = None`` (all rows)."""
    band = max(1, _BAND_BYTES // max(1, col_bytes_per_row))
    if xp is not numpy or is_pointwise(g) or band >= g.oh:
        return [(n0, n1, None) for n0, n1 in chunks]
    out = []
    for n0, n1 in chunks:
        if n1 - n0 > 1:
            out.append((n0, n1, None))
        else:
            out += [(n0, n1, (r, min(g.oh, r + band)))
                    for r in range(0, g.oh, band)]
    return out


@host.cpu_kernel
def conv_forward(x, W, g, groups):
    """y = conv(x, W) without bias; x (N, C, h, w), W (O, C/G, kh, kw)."""
    xp = backend.get_array_module(x)
    if xp is numpy and _strided_pointwise.fits(g):
        return conv_forward(_strided_pointwise.take(x, g), W,
                            _strided_pointwise.geometry(g), groups)
    n, c = x.shape[:2]
    o = W.shape[0]
    p = g.oh * g.ow
    w2 = W.reshape(groups, o // groups, -1)
    y = _conv_matrices.output(xp, (n, o, g.oh, g.ow), x.dtype)
    per_image = c * g.kh * g.kw * p * x.dtype.itemsize
    chunks = _chunks(xp, n, per_image, p,
                     [(x, 1)] if is_pointwise(g) else ())

    def run(pieces):
        cols = _column_builder(x, g)
        for n0, n1, rows in pieces:
            if _batch_last_fits(xp, g, n0, n1, rows):
                col = _batch_last.columns(x, g, n0, n1)
                prod = _workspace('prod', (groups, o // groups, col.shape[1]),
                                  x.dtype)
                _parallel.matmul(w2, col.reshape(groups, w2.shape[2], -1),
                                 out=prod)
                _batch_last.scatter(y, n0, n1, prod)
                continue
            col = cols(n0, n1, rows).reshape(groups, w2.shape[2], -1)
            _conv_matrices.product_into(y, n0, n1, rows, w2, col)
    _parallel.over_chunks(run, _bands(xp, chunks, g, per_image // g.oh))
    return y


def _batch_last_fits(xp, g, n0, n1, rows):
    """Whether images n0..n1 take the images-last columns
    (``_batch_last.py``): on the CPU, for windows wider than one pixel
    over maps at most _BATCH_LAST_MAX_WIDTH wide, and chunks of at least
    _BATCH_LAST_MIN_IMAGES whole images (where the runs it copies are
    that many times longer)."""
    return (xp is numpy and not is_pointwise(g) and rows is None
            and g.ow <= _BATCH_LAST_MAX_WIDTH
            and n1 - n0 >= _BATCH_LAST_MIN_IMAGES)


@host.cpu_kernel
def conv_grad_w(x, gy, g, groups, w_shape):
    """dL/dW of y = conv(x, W) from x and gy = dL/dy; returns w_shape."""
    xp = backend.get_array_module(x)
    if xp is numpy and _strided_pointwise.fits(g):
        return conv_grad_w(_strided_pointwise.take(x, g), gy,
                           _strided_pointwise.geometry(g), groups, w_shape)
    n, c = x.shape[:2]
    o = gy.shape[1]
    p = g.oh * g.ow
    k = c // groups * g.kh * g.kw
    # OpenBLAS runs a product faster when the longer side of the result is
    # its rows, as in ResNet-50's early layers (gW 64 x 576 over 25,088
    # columns). Those accumulate gW^T (k, O) and transpose it once at the
    # end, which pays only while the summed columns dwarf that copy.
    flip = xp is numpy and o // groups < k and n * p >= _FLIP_MIN_COLUMNS
    per_image = c * g.kh * g.kw * p * x.dtype.itemsize

    def run(pieces):
        acc = None
        cols = _column_builder(x, g)
        for n0, n1, rows in pieces:
            if _batch_last_fits(xp, g, n0, n1, rows):
                col = _batch_last.columns(x, g, n0, n1).reshape(
                    groups, k, -1)
                gyc = _batch_last.gather(gy, n0, n1, 'gy').reshape(
                    groups, o // groups, -1)
            else:
                col = cols(n0, n1, rows).reshape(groups, k, -1)
                gyc = _conv_matrices.operand(gy, n0, n1, groups, rows, 'gy')
            # gy @ col^T lands in W's layout; BLAS reads col^T in place.
            part = (_parallel.matmul(col, gyc.transpose(0, 2, 1)) if flip
                    else _parallel.matmul(gyc, col.transpose(0, 2, 1)))
            acc = part if acc is None else xp.add(acc, part, out=acc)
        return acc
    chunks = _chunks(xp, n, per_image, p,
                     [(x, 1), (gy, groups)] if is_pointwise(g) else ())
    parts = _parallel.over_chunks(run, _bands(xp, chunks, g,
                                              per_image // g.oh))
    acc = parts[0]
    for part in parts[1:]:  # W-sized, split too (the GPU has one part)
        _parallel.add_into(acc, part)
    if flip:
        acc = numpy.ascontiguousarray(acc.transpose(0, 2, 1))
    return acc.reshape(w_shape)


def _flipped_weight(W, groups):
    """W (O, C/G, kh, kw) -> (C, O/G, kh, kw), each kernel rotated 180 deg."""
    o, cg, kh, kw = W.shape
    wf = W.reshape(groups, o // groups, cg, kh, kw).transpose(0, 2, 1, 3, 4)
    return backend.get_array_module(W).ascontiguousarray(
        wf[:, :, :, ::-1, ::-1]).reshape(groups * cg, o // groups, kh, kw)


@host.cpu_kernel
def deconv_forward(x, W, g, groups):
    """The transpose of conv_forward: x (N, O, oh, ow) -> y (N, C, h, w).

    W is the convolution's weight (O, C/G, kh, kw). Three routes:

    * 1x1 stride 1: one GEMM ``W^T @ x`` per chunk (BLAS reads W^T in place);
      a strided 1x1 is one too, spread into the pixels it read
      (``_strided_pointwise.py``).
    * stride 1 with a weight no larger than x: a convolution of x with the
      flipped, transposed kernel and pad ``d*(k-1) - p``. Transposing W costs
      a copy of W (slow for big matrices, hence the size test), but saves
      col2im's kh*kw accumulation passes over the output. Not for a W
      holding NaN or infinities where there is padding: the padding's zeros
      would multiply them (0 * inf is NaN) where col2im, as the body,
      never forms those products.
    * otherwise one GEMM ``W^T @ x`` giving columns, summed back into pixels
      (col2im; images last on small maps, ``_batch_last.add_columns``).
    """
    xp = backend.get_array_module(x)
    if xp is numpy and _strided_pointwise.fits(g):
        return _strided_pointwise.spread(deconv_forward(
            x, W, _strided_pointwise.geometry(g), groups), g)
    n, o = x.shape[:2]
    cg = W.shape[1]
    c = cg * groups
    p = g.oh * g.ow
    w2t = W.reshape(groups, o // groups, -1).transpose(0, 2, 1)
    if is_pointwise(g):
        y = _conv_matrices.output(xp, (n, c, g.h, g.w), x.dtype)

        def run_pointwise(chunks):
            for n0, n1 in chunks:
                xc = _conv_matrices.operand(x, n0, n1, groups, None, 'x')
                _conv_matrices.product_into(y, n0, n1, None, w2t, xc)
        _parallel.over_chunks(run_pointwise, _chunks(
            xp, n, o * p * x.dtype.itemsize, p, [(x, groups)]))
        return y
    fpad = (g.dy * (g.kh - 1) - g.ph, g.dx * (g.kw - 1) - g.pw)
    if (g.sy == g.sx == 1 and min(fpad) >= 0 and W.size <= x.size
            and (max(fpad) == 0 or numpy.isfinite(W.sum()))):
        fg = Geometry(g.kh, g.kw, 1, 1, fpad[0], fpad[1], g.dy, g.dx,
                      g.oh, g.ow, g.h, g.w)
        return conv_forward(x, _flipped_weight(W, groups), fg, groups)
    chunks = _chunks(xp, n, c * g.kh * g.kw * p * x.dtype.itemsize, p)
    # Images-last sums (_batch_last.add_columns) where the windows
    # overlap (a 1x1 window adds each column once: in place is faster) and
    # the output is larger than 2x2 (there the padded phases are 4x the
    # pixels and the usual adds as fast). That route writes every pixel of
    # its images; the other adds into zeros.
    last = (g.kh * g.kw > 1 and min(g.h, g.w) > 2
            and all(_batch_last_fits(xp, g, n0, n1, None)
                    for n0, n1 in chunks))
    y = _conv_matrices.output(xp, (n, c, g.h, g.w), x.dtype, zeros=not last)
    yc = y.swapaxes(0, 1)  # (C, N, h, w), C-contiguous

    def run(pieces):
        for n0, n1 in pieces:
            b = n1 - n0
            if last:
                xc = _batch_last.gather(x, n0, n1, 'x').reshape(
                    groups, o // groups, -1)
            else:
                xc = _conv_matrices.operand(x, n0, n1, groups, None, 'x')
            col = _workspace('col', (groups, cg * g.kh * g.kw, b * p),
                             x.dtype)
            _parallel.matmul(w2t, xc, out=col)
            if last:
                _batch_last.add_columns(col, y, g, n0, n1)
                continue
            col = col.reshape(c, g.kh, g.kw, b, g.oh, g.ow)
            _col2im_add(yc[:, n0:n1], col.transpose(0, 3, 1, 2, 4, 5), g)
    _parallel.over_chunks(run, chunks)
    return y
