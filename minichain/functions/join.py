"""Joining and splitting: concat, stack, split_axis.

concat and split_axis are each other's backward; stack's backward splits
and drops the stacked axis.
"""
import numpy

from minichain import backend
from minichain.function_node import FunctionNode
from minichain.variable import Variable
from minichain.functions._check import (check_array, check_axis,
                                        check_int_axis, check_same_dtype)
from minichain.functions.array import reshape

__all__ = ['concat', 'stack', 'split_axis']


class Concat(FunctionNode):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, inputs):
        xp = backend.get_array_module(*inputs)
        self.ends = tuple(numpy.cumsum([x.shape[self.axis] for x in inputs]))
        return xp.concatenate(inputs, axis=self.axis),

    def backward(self, indexes, grad_outputs):
        parts = split_axis(grad_outputs[0], list(self.ends[:-1]), self.axis)
        return tuple(parts[i] for i in indexes)


def _check_join(func_name, xs):
    """Validate a sequence of arrays to join; return their arrays."""
    if not isinstance(xs, (list, tuple)) or not xs:
        raise TypeError('{}: xs must be a non-empty list or tuple of '
                        'Variables or arrays, got {!r}'.format(func_name, xs))
    arrays = [check_array(func_name, x, 'xs[{}]'.format(i))
              for i, x in enumerate(xs)]
    check_same_dtype(func_name, *arrays)
    return arrays


def concat(xs, axis=1):
    """Join arrays along an existing axis.

    Args:
        xs: list or tuple of Variables/ndarrays of one dtype and ndim whose
            shapes agree except along ``axis``.
        axis: the axis to join along (default 1, as in Chainer).
    Returns:
        Variable whose ``axis`` length is the sum of the inputs' lengths.
    """
    arrays = _check_join('concat', xs)
    shape0 = arrays[0].shape
    if arrays[0].ndim == 0:
        raise ValueError('concat: inputs must have at least one axis, got '
                         'shape ()')
    axis = check_axis('concat', axis, arrays[0].ndim, shape0)
    for a in arrays[1:]:
        if (a.ndim != len(shape0) or a.shape[:axis] != shape0[:axis]
                or a.shape[axis + 1:] != shape0[axis + 1:]):
            raise ValueError('concat: shapes {} must agree except along '
                             'axis {}'.format(', '.join(str(b.shape)
                                                        for b in arrays),
                                              axis))
    return Concat(axis).apply(tuple(xs))[0]


class Stack(FunctionNode):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, inputs):
        xp = backend.get_array_module(*inputs)
        self.in_shape = inputs[0].shape
        return xp.stack(inputs, axis=self.axis),

    def backward(self, indexes, grad_outputs):
        gy, = grad_outputs
        parts = split_axis(gy, gy.shape[self.axis], self.axis)
        return tuple(reshape(parts[i], self.in_shape) for i in indexes)


def stack(xs, axis=0):
    """Join arrays of one shape along a new axis.

    Args:
        xs: list or tuple of ``n`` Variables/ndarrays of one shape and dtype.
        axis: where the new axis goes, in ``[-ndim - 1, ndim]``.
    Returns:
        Variable of ndim + 1 axes; the new axis has length ``n``.
    """
    arrays = _check_join('stack', xs)
    shape0 = arrays[0].shape
    if any(a.shape != shape0 for a in arrays):
        raise ValueError('stack: all inputs must have one shape, got {}'
                         .format(', '.join(str(a.shape) for a in arrays)))
    check_int_axis('stack', axis)
    if not -len(shape0) - 1 <= axis <= len(shape0):
        raise ValueError('stack: axis {} is out of range for inputs of shape '
                         '{}'.format(axis, shape0))
    return Stack(int(axis) % (len(shape0) + 1)).apply(tuple(xs))[0]


class SplitAxis(FunctionNode):
    def __init__(self, indices, axis):
        self.indices, self.axis = indices, axis

    def forward(self, inputs):
        x, = inputs
        xp = backend.get_array_module(x)
        self.dtype = x.dtype
        ys = tuple(xp.split(x, self.indices, axis=self.axis))
        self.out_shapes = tuple(y.shape for y in ys)
        return ys

    def backward(self, indexes, grad_outputs):
        xp = backend.get_array_module(
            *[g for g in grad_outputs if g is not None])
        # An output that got no gradient contributes zeros.
        gys = [Variable(xp.zeros(shape, dtype=self.dtype), requires_grad=False)
               if g is None else g
               for g, shape in zip(grad_outputs, self.out_shapes)]
        return concat(gys, self.axis),


def split_axis(x, indices_or_sections, axis):
    """Split ``x`` along ``axis`` into several Variables.

    Args:
        x: Variable or ndarray with at least one axis.
        indices_or_sections: an int ``n`` (``n`` equal parts; it must divide
            the axis length) or a non-decreasing sequence of split points in
            ``[0, x.shape[axis]]``.
        axis: the axis to split.
    Returns:
        tuple of Variables (one FunctionNode with several outputs); their
        ``axis`` lengths add up to ``x.shape[axis]``.
    """
    xa = check_array('split_axis', x, 'x')
    if xa.ndim == 0:
        raise ValueError('split_axis: x must have at least one axis, got '
                         'shape ()')
    axis = check_axis('split_axis', axis, xa.ndim, xa.shape)
    size = xa.shape[axis]
    if isinstance(indices_or_sections, (int, numpy.integer)):
        n = int(indices_or_sections)
        if n <= 0 or size % n:
            raise ValueError('split_axis: {} sections do not divide axis {} '
                             'of shape {}'.format(n, axis, xa.shape))
        indices = [size // n * k for k in range(1, n)]
    else:
        indices = [int(i) for i in indices_or_sections]
        if any(not 0 <= i <= size for i in indices) or indices != sorted(
                indices):
            raise ValueError('split_axis: split points {} must be '
                             'non-decreasing and within [0, {}] (axis {} of '
                             'shape {})'.format(indices, size, axis,
                                                xa.shape))
    return SplitAxis(indices, axis).apply((x,))
