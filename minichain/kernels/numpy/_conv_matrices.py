"""Activations as the matrices of a convolution's products, on either
device: images n0..n1 of an (N, C, h, w) array as (G, C/G, columns) with
the columns in (image, row, column) order. A channel-major array
(``_layout.py``) is such a matrix already, and BLAS reads or writes it in
place; other memory is reordered through a per-thread workspace.
"""
import numpy

from minichain import backend
from minichain.kernels.numpy import _layout, _parallel


def matrix(a, n0, n1, groups, rows=None):
    """Images n0..n1 of ``a`` (N, C, oh, ow) as a (G, C/G, columns) view
    that BLAS reads or writes in place (output rows ``rows = (r0, r1)`` of
    a single image only, when given), or None where the memory has no such
    view: NCHW across several images (``_layout.py``)."""
    c, ow = a.shape[1], a.shape[3]
    p = a.shape[2] * ow
    ac = _layout.channel_major(a)
    if ac is not None:  # (C, N*P): the images' columns side by side
        m, lo = ac.reshape(groups, c // groups, -1), n0 * p
    elif n1 - n0 == 1 and a[n0].flags.c_contiguous:
        m, lo = a[n0].reshape(groups, c // groups, p), 0
    else:
        return None
    if rows is None:
        return m[:, :, lo:lo + (n1 - n0) * p]
    return m[:, :, lo + rows[0] * ow:lo + rows[1] * ow]


def operand(a, n0, n1, groups, rows, name):
    """:func:`matrix`, or the images reordered into workspace ``name``
    where no view exists."""
    m = matrix(a, n0, n1, groups, rows)
    if m is not None:
        return m
    c, ow = a.shape[1], a.shape[3]
    xp = backend.get_array_module(a)
    shape = (c, n1 - n0, a.shape[2] * ow)
    out = (_parallel.workspace(name, shape, a.dtype) if xp is numpy
           else xp.empty(shape, a.dtype))
    xp.copyto(out, a[n0:n1].reshape(n1 - n0, *shape[::2]).transpose(1, 0, 2))
    m = out.reshape(groups, c // groups, -1)
    return m if rows is None else m[:, :, rows[0] * ow:rows[1] * ow]


def output(xp, shape, dtype, zeros=False):
    """A kernel's (N, C, h, w) result: channel-major on the CPU."""
    if xp is numpy:
        make = (_layout.zeros_channel_major if zeros
                else _layout.empty_channel_major)
        return make(shape, dtype)
    return (xp.zeros if zeros else xp.empty)(shape, dtype)


def product_into(y, n0, n1, rows, a, b):
    """``a @ b`` written into images n0..n1 (rows ``rows``) of y."""
    out = matrix(y, n0, n1, a.shape[0], rows)
    if out is not None:
        _parallel.matmul(a, b, out=out)
        return
    # NCHW across images: the (G, O/G, B*P) product is reordered into y
    k, o = n1 - n0, y.shape[1]
    backend.get_array_module(y).copyto(
        y[n0:n1].reshape(k, o, -1),
        _parallel.matmul(a, b).reshape(o, k, -1).transpose(1, 0, 2))
