"""Reductions: sum, mean (and its weighted form, average), max, min,
logsumexp.

Each backward reshapes the output gradient back to keepdims form and
broadcasts it over the reduced axes (max/min then mask it).
"""
import math

from minichain import backend
from minichain.function_node import FunctionNode
from minichain.variable import Variable
from minichain.functions import array as _array
from minichain.functions import basic_math as _math
from minichain.functions.math import exp
from minichain.functions._check import (check_array, check_float,
                                        check_same_dtype, normalize_axis)

__all__ = ['sum', 'mean', 'average', 'max', 'min', 'logsumexp']


def _keepdims_shape(in_shape, axis):
    """The shape of a reduction over ``axis`` with keepdims=True."""
    if axis is None:
        return (1,) * len(in_shape)
    return tuple(1 if i in axis else s for i, s in enumerate(in_shape))


def _spread(gy, in_shape, axis, keepdims):
    """Broadcast a reduction's output gradient back to the input shape."""
    if not keepdims:
        gy = _array.reshape(gy, _keepdims_shape(in_shape, axis))
    return _array.broadcast_to(gy, in_shape)


def _reduced_size(in_shape, axis):
    return math.prod(s for i, s in enumerate(in_shape)
                     if axis is None or i in axis)


class Sum(FunctionNode):
    def __init__(self, axis, keepdims):
        self.axis, self.keepdims = axis, keepdims

    def forward(self, inputs):
        x, = inputs
        self.in_shape = x.shape
        return x.sum(axis=self.axis, keepdims=self.keepdims),

    def backward(self, indexes, grad_outputs):
        return _spread(grad_outputs[0], self.in_shape, self.axis,
                       self.keepdims),


def sum(x, axis=None, keepdims=False):
    """Sum of elements over ``axis`` (None: all axes).

    Args:
        x: Variable or ndarray of any shape.
        axis: None, an int or a tuple of ints (negative values allowed).
        keepdims: keep reduced axes with length 1.
    Returns:
        Variable with the reduced axes removed (or of length 1).
    """
    xa = check_array('sum', x, 'x')
    axis = normalize_axis('sum', axis, xa.ndim)
    return Sum(axis, keepdims).apply((x,))[0]


class Mean(FunctionNode):
    def __init__(self, axis, keepdims):
        self.axis, self.keepdims = axis, keepdims

    def forward(self, inputs):
        x, = inputs
        self.in_shape = x.shape
        return x.mean(axis=self.axis, keepdims=self.keepdims),

    def backward(self, indexes, grad_outputs):
        n = _reduced_size(self.in_shape, self.axis)
        gx = _spread(grad_outputs[0], self.in_shape, self.axis, self.keepdims)
        return gx * (1.0 / n),


def mean(x, axis=None, keepdims=False):
    """Arithmetic mean over ``axis``: ``sum(x, axis) / n``.

    Args:
        x: float Variable or ndarray of any shape.
        axis: None (all axes), an int or a tuple of ints.
        keepdims: keep reduced axes with length 1.
    Returns:
        Variable of the reduced shape; ``dy/dx = 1 / n`` where ``n`` is the
        number of elements averaged into each output.
    Raises:
        ValueError when the reduced axes hold no element.
    """
    xa = check_float('mean', x, 'x')
    axis = normalize_axis('mean', axis, xa.ndim)
    _check_nonempty('mean', xa.shape, axis)
    return Mean(axis, keepdims).apply((x,))[0]


def average(x, axis=None, weights=None, keepdims=False):
    """Weighted mean over ``axis``: ``sum(x * w, axis) / sum(w)``, made of
    other functions (Chainer's ``F.average``); without weights,
    :func:`mean`.

    Args:
        x: float Variable or ndarray.
        axis: None (all axes) or an int; a tuple of ints only without
            weights.
        weights: None, or a Variable or ndarray of ``x``'s dtype: of
            ``x``'s shape when ``axis`` is None, else of shape
            ``(x.shape[axis],)``. Gradients flow to it too.
        keepdims: keep reduced axes with length 1.
    Returns:
        Variable of the reduced shape.
    Raises:
        ValueError: a tuple axis with weights, or weights of another shape.
    """
    if weights is None:
        return mean(x, axis, keepdims)
    xa = check_float('average', x, 'x')
    wa = check_array('average', weights, 'weights')
    check_same_dtype('average', xa, wa)
    axis = normalize_axis('average', axis, xa.ndim)
    if axis is not None and len(axis) > 1:
        raise ValueError('average: axis {} has several axes; with weights '
                         'only None or one axis'.format(axis))
    want = xa.shape if axis is None else (xa.shape[axis[0]],)
    if wa.shape != want:
        raise ValueError('average: weights of shape {} for x of shape {} '
                         'and axis {}: expected shape {}'.format(
                             wa.shape, xa.shape, axis, want))
    total = sum(weights)
    if axis is not None:  # along the axis, the same weight in every row
        lined_up = [d if i in axis else 1 for i, d in enumerate(xa.shape)]
        weights = _array.reshape(weights, lined_up)
    return _math.div(sum(_math.mul(x, weights), axis, keepdims), total)


class _Extremum(FunctionNode):
    """Shared max/min node; the gradient goes to every element equal to
    the result (ties share it, as in Chainer)."""

    def __init__(self, axis, keepdims):
        self.axis, self.keepdims = axis, keepdims

    def forward(self, inputs):
        self.retain_inputs((0,))
        self.retain_outputs((0,))
        x, = inputs
        return self._reduce(x, axis=self.axis, keepdims=self.keepdims),

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        y, = self.get_retained_outputs()
        y = y.array.reshape(_keepdims_shape(x.shape, self.axis))
        mask = Variable((x.array == y).astype(x.dtype), requires_grad=False)
        return _spread(grad_outputs[0], x.shape, self.axis,
                       self.keepdims) * mask,


class Max(_Extremum):
    @staticmethod
    def _reduce(x, axis, keepdims):
        return x.max(axis=axis, keepdims=keepdims)


class Min(_Extremum):
    @staticmethod
    def _reduce(x, axis, keepdims):
        return x.min(axis=axis, keepdims=keepdims)


def _check_nonempty(name, shape, axis):
    if _reduced_size(shape, axis) == 0:
        raise ValueError('{}: cannot reduce an empty selection: shape {}, '
                         'axis {}'.format(name, shape, axis))


def _extremum(name, cls, x, axis, keepdims):
    xa = check_array(name, x, 'x')
    axis = normalize_axis(name, axis, xa.ndim)
    _check_nonempty(name, xa.shape, axis)
    return cls(axis, keepdims).apply((x,))[0]


def max(x, axis=None, keepdims=False):
    """Maximum of elements over ``axis`` (None: all axes).

    Args:
        x: Variable or ndarray of any shape.
        axis: None, an int or a tuple of ints.
        keepdims: keep reduced axes with length 1.
    Returns:
        Variable of the reduced shape. The gradient flows to the elements
        equal to the maximum (to all of them on ties).
    """
    return _extremum('max', Max, x, axis, keepdims)


def min(x, axis=None, keepdims=False):
    """Minimum of elements over ``axis``; arguments as in :func:`max`."""
    return _extremum('min', Min, x, axis, keepdims)


class LogSumExp(FunctionNode):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, inputs):
        self.retain_inputs((0,))
        self.retain_outputs((0,))
        x, = inputs
        xp = backend.get_array_module(x)
        m = xp.asarray(x.max(axis=self.axis, keepdims=True))
        # Shifting by the max keeps exp() from overflowing; an all -inf (or
        # inf) slice would make the shift NaN, so such slices shift by 0.
        m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))
        s = xp.exp(x - m).sum(axis=self.axis, keepdims=True)
        y = xp.asarray(xp.log(s) + m)
        out_shape = tuple(d for i, d in enumerate(x.shape)
                          if self.axis is not None and i not in self.axis)
        return y.reshape(out_shape),

    def backward(self, indexes, grad_outputs):
        # d/dx logsumexp(x) = softmax(x) = exp(x - y)
        x, = self.get_retained_inputs()
        y, = self.get_retained_outputs()
        y = _spread(y, x.shape, self.axis, False)
        gy = _spread(grad_outputs[0], x.shape, self.axis, False)
        return gy * exp(x - y),


def logsumexp(x, axis=None):
    """``log(sum(exp(x), axis))``, computed without overflow.

    Args:
        x: float Variable or ndarray of any shape.
        axis: None (all axes), an int or a tuple of ints.
    Returns:
        Variable with the reduced axes removed. Its gradient is the softmax
        of ``x`` over ``axis``.
    """
    xa = check_float('logsumexp', x, 'x')
    axis = normalize_axis('logsumexp', axis, xa.ndim)
    _check_nonempty('logsumexp', xa.shape, axis)
    return LogSumExp(axis).apply((x,))[0]
