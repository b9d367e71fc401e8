"""Shape manipulation: broadcast_to, sum_to, reshape, transpose, get_item, ...

These move elements around without arithmetic, so each backward is the
inverse movement (broadcast <-> sum, transpose <-> inverse transpose).
"""
import numpy

from minichain import backend
from minichain.function_node import FunctionNode
from minichain.functions._check import (check_array, check_float,
                                        check_int_axis, normalize_axis,
                                        unwrap)
from minichain.variable import Variable

__all__ = ['broadcast_to', 'sum_to', 'reshape', 'transpose', 'get_item',
           'expand_dims', 'flatten', 'squeeze', 'cast']


def _sum_to_array(x, shape):
    """Sum array ``x`` down to ``shape`` (the inverse of broadcasting)."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, s in enumerate(shape)
        if s == 1 and x.shape[lead + i] != 1)
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
    xa = check_array('broadcast_to', x, 'x')
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
    xa = check_array('sum_to', x, 'x')
    shape = tuple(shape)
    lead = xa.ndim - len(shape)
    if lead < 0 or any(s not in (1, xs)
                       for s, xs in zip(shape, xa.shape[lead:])):
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
    xa = check_array('reshape', x, 'x')
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
    xa = check_array('transpose', x, 'x')
    if axes is not None:
        given = tuple(axes)
        # Range-check before wrapping: axis 3 of a 2-D array is an error,
        # not axis 1.
        axes = tuple(int(a) % xa.ndim if -xa.ndim <= a < xa.ndim else None
                     for a in given)
        if sorted(axes, key=lambda a: -1 if a is None else a) != list(
                range(xa.ndim)):
            raise ValueError('transpose: axes {} are not a permutation of the '
                             '{} axes of shape {}'.format(given, xa.ndim,
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
    xa = check_array('expand_dims', x, 'x')
    check_int_axis('expand_dims', axis)
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
    """Scatter-add ``gy`` into zeros of the input shape (get_item backward)."""

    def __init__(self, slices, in_shape):
        self.slices, self.in_shape = slices, in_shape

    def forward(self, inputs):
        gy, = inputs
        xp = backend.get_array_module(gy)
        gx = xp.zeros(self.in_shape, dtype=gy.dtype)
        # add.at accumulates repeated integer indices (x[[0, 0]]) correctly;
        # CuPy has it since v12 (earlier: cupyx.scatter_add).
        xp.add.at(gx, self.slices, gy)
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
    xa = check_array('get_item', x, 'x')
    xp = backend.get_array_module(xa)

    def as_index(s):
        s = unwrap(s)
        if isinstance(s, list) or (xp is not numpy
                                   and isinstance(s, numpy.ndarray)):
            return xp.asarray(s)  # index arrays live where x lives
        return s

    if isinstance(slices, tuple):
        slices = tuple(as_index(s) for s in slices)
    else:
        slices = as_index(slices)
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


class Flatten(FunctionNode):
    def forward(self, inputs):
        x, = inputs
        self.in_shape = x.shape
        return x.reshape(-1),

    def backward(self, indexes, grad_outputs):
        return reshape(grad_outputs[0], self.in_shape),


def flatten(x):
    """Flatten ``x`` into a 1-D array (row-major order).

    Args:
        x: Variable or ndarray of any shape.
    Returns:
        Variable of shape ``(x.size,)``.
    """
    check_array('flatten', x, 'x')
    return Flatten().apply((x,))[0]


class Squeeze(FunctionNode):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, inputs):
        x, = inputs
        self.in_shape = x.shape
        return x.squeeze(self.axis),

    def backward(self, indexes, grad_outputs):
        return reshape(grad_outputs[0], self.in_shape),


def squeeze(x, axis=None):
    """Remove axes of length 1.

    Args:
        x: Variable or ndarray of any shape.
        axis: None (every length-1 axis), an int or a tuple of ints; each
            named axis must have length 1.
    Returns:
        Variable of ``x``'s shape without the removed axes.
    """
    xa = check_array('squeeze', x, 'x')
    axis = normalize_axis('squeeze', axis, xa.ndim)
    if axis is None:
        axis = tuple(i for i, s in enumerate(xa.shape) if s == 1)
    bad = [a for a in axis if xa.shape[a] != 1]
    if bad:
        raise ValueError('squeeze: axis {} of shape {} does not have length 1'
                         .format(bad[0], xa.shape))
    return Squeeze(axis).apply((x,))[0]


class Cast(FunctionNode):
    def __init__(self, dtype, in_dtype):
        self.dtype, self.in_dtype = dtype, in_dtype

    def forward(self, inputs):
        x, = inputs
        return x.astype(self.dtype),

    def backward(self, indexes, grad_outputs):
        return cast(grad_outputs[0], self.in_dtype),


def cast(x, dtype):
    """``x`` in another floating-point dtype; its gradient is cast back.

    What mixed precision is made of: a float32 parameter cast to float16
    or ``ml_dtypes.bfloat16`` for the product, its gradient coming back
    float32. Returns ``x`` itself (a Variable) when it has the dtype.

    Args:
        x: Variable or ndarray, floating point.
        dtype: a floating-point dtype (``numpy.float16``, ``'bfloat16'``
            with ml_dtypes installed, ...).
    Returns:
        Variable of ``x``'s shape in ``dtype``.
    """
    xa = check_float('cast', x, 'x')
    dtype = numpy.dtype(dtype)
    if not backend.is_float(dtype):
        raise TypeError('cast: dtype must be floating point, got {}'.format(
            dtype))
    if xa.dtype == dtype:
        return x if isinstance(x, Variable) else Variable(x)
    return Cast(dtype, xa.dtype).apply((x,))[0]
