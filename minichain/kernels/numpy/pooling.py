"""Pooling on NumPy over the input's stride phases (``_phase_grid.py``):
each of the kh*kw kernel offsets is one contiguous slice per plane, where
the body's strided windows run 10-15 times slower; the updates are
branch-free (``copyto(where=)`` with a random mask ran ~10x slower than
these arithmetic ones). A channel-major input (``_layout.py``) is pooled
as its C-contiguous (C, N, h, w) transpose and its results keep its
layout: pooling treats the N and C axes alike."""
import functools

import numpy

from minichain import kernels
from minichain.functions.pooling import (AveragePooling2D,
                                         AveragePooling2DGrad, MaxPooling2D,
                                         MaxPooling2DGather, MaxPooling2DGrad)
from minichain.kernels.numpy import _layout
from minichain.kernels.numpy._phase_grid import PhaseGrid


def _planes(a):
    """``(planes, swapped)``: ``a`` itself, or the C-contiguous (C, N, h, w)
    transpose of a channel-major ``a`` (undone by :func:`_as_planes`)."""
    if a.flags.c_contiguous or _layout.channel_major(a) is None:
        return a, False
    return a.swapaxes(0, 1), True


def _as_planes(a, swapped):
    return a.swapaxes(0, 1) if swapped else a


def _on_planes(body):
    """The kernel of ``body(node, planes, swapped, grid)``: it declines
    inputs other than NumPy's own (``_layout.native``), runs ``body`` on
    the planes of the node's one input and gives its result back that
    input's layout."""
    @functools.wraps(body)
    def kernel(node, inputs):
        if not _layout.native(inputs):
            return None
        a, swap = _planes(inputs[0])
        return _as_planes(body(node, a, swap, PhaseGrid(node.g)), swap),
    return kernel


@_on_planes
def max_pooling_2d(node, x, swap, grid):
    ph = grid.split(x, -numpy.inf)
    best = idx = mask = step = None
    for k, a, b, shift in grid.offsets:  # raster order: first max wins
        v = grid.window(ph, a, b, shift)
        if best is None:
            best = v.copy()
            itype = numpy.int8 if len(grid.offsets) <= 127 else numpy.int32
            idx = numpy.zeros(best.shape, itype)
            mask = numpy.empty(best.shape, bool)
            step = numpy.empty(best.shape, itype)
            continue
        numpy.greater(v, best, out=mask)
        # best second: NumPy's maximum returns its second argument where
        # the two are equal, so that of +0.0 and -0.0 the first stays, as
        # the body's argmax picks it (the property test holds it there).
        numpy.maximum(v, best, out=best)
        numpy.subtract(itype(k), idx, out=step)
        numpy.multiply(step, mask, out=step)
        numpy.add(idx, step, out=idx)  # idx = k where v won
    _point_at_first_nan(grid, ph, best, idx)
    node.indexes = _as_planes(grid.crop(idx, x.shape[:2]), swap)
    return grid.crop(best, x.shape[:2])


def _point_at_first_nan(grid, ph, best, idx):
    """NaN wins a window, as in NumPy's max and argmax and in cuDNN
    (CUDNN_PROPAGATE_NAN): ``maximum`` already carried NaN into ``best``;
    here ``idx`` is moved to the window's first NaN, so that the gradient
    goes where the NaN came from. One pass over the output when there is
    no NaN."""
    nan = numpy.isnan(best)
    if not nan.any():
        return
    for k, a, b, shift in reversed(grid.offsets):  # the first NaN is set last
        hit = numpy.isnan(grid.window(ph, a, b, shift)) & nan
        idx[hit] = k


@_on_planes
def max_pooling_2d_grad(node, gy, swap, grid):
    gyf = grid.expand(gy, 0)
    idxf = grid.expand(_as_planes(node.indexes, swap), -1)
    acc = grid.zeros(gyf.shape[0], gy.dtype)
    mask = numpy.empty(gyf.shape, bool)
    part = numpy.empty(gyf.shape, gy.dtype)
    for k, a, b, shift in grid.offsets:
        dst = grid.window(acc, a, b, shift)
        numpy.equal(idxf, k, out=mask)
        numpy.multiply(gyf, mask, out=part)  # branch-free masked add
        numpy.add(dst, part, out=dst)
    return grid.merge(acc, gy.shape[:2])


@_on_planes
def max_pooling_2d_gather(node, ggx, swap, grid):
    ph = grid.split(ggx, 0)
    idxf = grid.expand(_as_planes(node.indexes, swap), -1)
    out = numpy.empty(idxf.shape, ggx.dtype)
    part = numpy.empty(idxf.shape, ggx.dtype)
    for k, a, b, shift in grid.offsets:  # the masks are disjoint
        # the first product is the start, as in the body (not +0.0, which
        # would turn a -0.0 into +0.0)
        numpy.multiply(grid.window(ph, a, b, shift), idxf == k,
                       out=part if k else out)
        if k:
            numpy.add(out, part, out=out)
    return grid.crop(out, ggx.shape[:2])


@_on_planes
def average_pooling_2d(node, x, swap, grid):
    ph = grid.split(x, 0)
    acc = None
    for k, a, b, shift in grid.offsets:
        v = grid.window(ph, a, b, shift)
        acc = v.copy() if acc is None else numpy.add(acc, v, out=acc)
    acc *= x.dtype.type(1.0 / len(grid.offsets))
    return grid.crop(acc, x.shape[:2])


@_on_planes
def average_pooling_2d_grad(node, gy, swap, grid):
    gyf = grid.expand(gy, 0)
    gyf *= gy.dtype.type(1.0 / len(grid.offsets))
    acc = grid.zeros(gyf.shape[0], gy.dtype)
    for k, a, b, shift in grid.offsets:
        dst = grid.window(acc, a, b, shift)
        numpy.add(dst, gyf, out=dst)
    return grid.merge(acc, gy.shape[:2])


kernels.register(MaxPooling2D, 'numpy', max_pooling_2d)
kernels.register(MaxPooling2DGrad, 'numpy', max_pooling_2d_grad)
kernels.register(MaxPooling2DGather, 'numpy', max_pooling_2d_gather)
kernels.register(AveragePooling2D, 'numpy', average_pooling_2d)
kernels.register(AveragePooling2DGrad, 'numpy', average_pooling_2d_grad)
