"""Shape manipulation: broadcast_to, sum_to, reshape, transpose, get_item, ...

These move elements around without arithmetic, so each backward is the
inverse movement (broadcast <-> sum, transpose <-> inverse transpose).
"""
import numpy

from minichain import backend
from minichain.function_node import FunctionNode
from minichain.functions._check import check_array, unwrap

__all__ = ['broadcast_to', 'sum_to', 'reshape', 'transpose', 'get_item',
           'expand_dims']


def _sum_to_array(x, shape):
    """Sum array ``x`` down to ``shape`` (the inverse of broadcasting)."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1)
    y = x.sum(axis=axes, keepdims=True) if axes else x
    if lead:
        y = y.reshape(shape)
    return y


class BroadcastTo(FunctionNode):
    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, inputs):
        x, = inputs
        self.in_shape = x.shape
        xp = backend.get_array_module(x)
        return xp.broadcast_to(x, self.shape),

    def backward(self, indexes, grad_outputs):
        return sum_to(grad_outputs[0], self.in_shape),


class SumTo(FunctionNode):
    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, inputs):
        x, = inputs
        self.in_shape = x.shape
        return _sum_to_array(x, self.shape),

    def backward(self, indexes, grad_outputs):
        return broadcast_to(grad_outputs[0], self.in_shape),


def broadcast_to(x, shape):
    """Broadcast ``x`` to ``shape`` (NumPy rules); backward sums back.

    Args:
        x: Variable or ndarray; shape: target shape it broadcasts to.
    Returns:
        Variable of shape ``shape``.
    """
    xa = unwrap(x)
    check_array('broadcast_to', xa, 'x')
    shape = tuple(shape)
    try:
        numpy.broadcast_shapes(xa.shape, shape)
        ok = numpy.broadcast_shapes(xa.shape, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError('broadcast_to: cannot broadcast shape {} to {}'
                         .format(xa.shape, shape))
    if xa.shape == shape:
        return _identity(x)
    return BroadcastTo(shape).apply((x,))[0]


def sum_to(x, shape):
    """Sum ``x`` over broadcast axes so that the result has ``shape``.

    ``shape`` must broadcast to ``x.shape`` (this is broadcast_to's inverse).
    """
    xa = unwrap(x)
    check_array('sum_to', xa, 'x')
    shape = tuple(shape)
    lead = xa.ndim - len(shape)
    if lead < 0 or any(s not in (1, xs) for s, xs in zip(shape, xa.shape[lead:])):
        raise ValueError('sum_to: shape {} does not broadcast to the input '
                         'shape {}'.format(shape, xa.shape))
    if xa.shape == shape:
        return _identity(x)
    return SumTo(shape).apply((x,))[0]


class Reshape(FunctionNode):
    def __init__(self, shape):
        self.shape = shape

    def forward(self, inputs):
        x, = inputs
        self.in_shape = x.shape
        return x.reshape(self.shape),

    def backward(self, indexes, grad_outputs):
        return reshape(grad_outputs[0], self.in_shape),


def reshape(x, shape):
    """Reshape ``x`` to ``shape`` (one entry may be -1); sizes must match."""
    xa = unwrap(x)
    check_array('reshape', xa, 'x')
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    known = int(numpy.prod([s for s in shape if s != -1]))
    if (shape.count(-1) > 1
            or (-1 not in shape and known != xa.size)
            or (-1 in shape and (known == 0 or xa.size % known))):
        raise ValueError('reshape: cannot reshape an array of shape {} '
                         '(size {}) into shape {}'.format(xa.shape, xa.size,
                                                          shape))
    if xa.shape == shape:
        return _identity(x)
    return Reshape(shape).apply((x,))[0]


class Transpose(FunctionNode):
    def __init__(self, axes):
        self.axes = axes

    def forward(self, inputs):
        return inputs[0].transpose(self.axes),

    def backward(self, indexes, grad_outputs):
        inv = None if self.axes is None else tuple(numpy.argsort(self.axes))
        return transpose(grad_outputs[0], inv),


def transpose(x, axes=None):
    """Permute the axes of ``x`` (reverse them when ``axes`` is None).

    Returns a Variable of shape ``tuple(x.shape[a] for a in axes)``.
    """
    xa = unwrap(x)
    check_array('transpose', xa, 'x')
    if axes is not None:
        axes = tuple(int(a) % max(xa.ndim, 1) for a in axes)
        if sorted(axes) != list(range(xa.ndim)):
            raise ValueError('transpose: axes {} are not a permutation of the '
                             '{} axes of shape {}'.format(axes, xa.ndim,
                                                          xa.shape))
    return Transpose(axes).apply((x,))[0]


class ExpandDims(FunctionNode):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, inputs):
        x, = inputs
        self.in_shape = x.shape
        xp = backend.get_array_module(x)
        return xp.expand_dims(x, self.axis),

    def backward(self, indexes, grad_outputs):
        return reshape(grad_outputs[0], self.in_shape),


def expand_dims(x, axis):
    """Insert an axis of length 1 at ``axis`` (output has ndim + 1 axes)."""
    xa = unwrap(x)
    check_array('expand_dims', xa, 'x')
    if not -xa.ndim - 1 <= axis <= xa.ndim:
        raise ValueError('expand_dims: axis {} is out of range for shape {}'
                         .format(axis, xa.shape))
    return ExpandDims(axis).apply((x,))[0]


class GetItem(FunctionNode):
    def __init__(self, slices):
        self.slices = slices

    def forward(self, inputs):
        x, = inputs
        self.in_shape, self.in_dtype = x.shape, x.dtype
        return x[self.slices],

    def backward(self, indexes, grad_outputs):
        return GetItemGrad(self.slices, self.in_shape).apply(grad_outputs)


class GetItemGrad(FunctionNode):
    """Scatter-add ``gy`` into zeros of the input shape (get_item's backward)."""

    def __init__(self, slices, in_shape):
        self.slices, self.in_shape = slices, in_shape

    def forward(self, inputs):
        gy, = inputs
        xp = backend.get_array_module(gy)
        gx = xp.zeros(self.in_shape, dtype=gy.dtype)
        # add.at accumulates repeated integer indices (x[[0, 0]]) correctly.
        if xp is numpy:
            numpy.add.at(gx, self.slices, gy)
        else:
            gx.scatter_add(self.slices, gy)
        return gx,

    def backward(self, indexes, grad_outputs):
        return get_item(grad_outputs[0], self.slices),


def get_item(x, slices):
    """``x[slices]`` as a differentiable function (basic and advanced indexing).

    Args:
        x: Variable or ndarray; slices: anything NumPy accepts as an index.
    Returns:
        Variable of the indexed shape.
    """
    xa = unwrap(x)
    check_array('get_item', xa, 'x')
    if isinstance(slices, list):
        slices = numpy.asarray(slices)
    if isinstance(slices, tuple):
        slices = tuple(numpy.asarray(s) if isinstance(s, list) else unwrap(s)
                       for s in slices)
    else:
        slices = unwrap(slices)
    try:
        return GetItem(slices).apply((x,))[0]
    except (IndexError, TypeError, ValueError) as e:
        raise IndexError('get_item: index {!r} is invalid for shape {}: {}'
                         .format(slices, xa.shape, e)) from None


class Identity(FunctionNode):
    def forward(self, inputs):
        return inputs

    def backward(self, indexes, grad_outputs):
        return grad_outputs


def _identity(x):
    """A new Variable node that passes ``x`` through (keeps the graph shape)."""
    return Identity().apply((x,))[0]
