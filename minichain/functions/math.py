"""Elementwise math: exp, log, sqrt, square, absolute, maximum, minimum, clip.

Every backward is built from functions, so each of them can be
differentiated again. The piecewise ones (absolute, maximum, minimum, clip)
multiply by a constant 0/1 mask: the mask has a zero derivative almost
everywhere, so a constant is the exact second-order answer off the kinks.
"""
import numpy

from minichain import backend
from minichain.function_node import FunctionNode
from minichain.variable import Variable
from minichain.functions import array as _array
from minichain.functions._check import check_binary, check_float

__all__ = ['exp', 'log', 'sqrt', 'square', 'absolute', 'maximum', 'minimum',
           'clip']


def _const(mask, dtype):
    """A 0/1 mask as a constant Variable of ``dtype`` (no gradient)."""
    return Variable(mask.astype(dtype), requires_grad=False)


def _sum_to(gy, shape):
    return gy if gy.shape == shape else _array.sum_to(gy, shape)


class Exp(FunctionNode):
    def forward(self, inputs):
        self.retain_outputs((0,))
        xp = backend.get_array_module(inputs[0])
        return xp.exp(inputs[0]),

    def backward(self, indexes, grad_outputs):
        y, = self.get_retained_outputs()
        return grad_outputs[0] * y,


class Log(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0,))
        xp = backend.get_array_module(inputs[0])
        return xp.log(inputs[0]),

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        return grad_outputs[0] / x,


class Sqrt(FunctionNode):
    def forward(self, inputs):
        self.retain_outputs((0,))
        xp = backend.get_array_module(inputs[0])
        return xp.sqrt(inputs[0]),

    def backward(self, indexes, grad_outputs):
        y, = self.get_retained_outputs()
        return grad_outputs[0] / (2 * y),


class Square(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0,))
        xp = backend.get_array_module(inputs[0])
        return xp.square(inputs[0]),

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        return grad_outputs[0] * (2 * x),


class Absolute(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0,))
        xp = backend.get_array_module(inputs[0])
        return xp.abs(inputs[0]),

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        sign = x.xp.sign(x.array)
        return grad_outputs[0] * _const(sign, x.dtype),


class Maximum(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0, 1))
        xp = backend.get_array_module(*inputs)
        return xp.maximum(*inputs),

    def backward(self, indexes, grad_outputs):
        x1, x2 = self.get_retained_inputs()
        # Ties send the gradient to x1, as Chainer does.
        return _select_grads(indexes, grad_outputs[0], x1, x2,
                             x1.array >= x2.array)


class Minimum(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0, 1))
        xp = backend.get_array_module(*inputs)
        return xp.minimum(*inputs),

    def backward(self, indexes, grad_outputs):
        x1, x2 = self.get_retained_inputs()
        return _select_grads(indexes, grad_outputs[0], x1, x2,
                             x1.array <= x2.array)


def _select_grads(indexes, gy, x1, x2, first):
    """Route ``gy`` to x1 where ``first`` holds, else to x2."""
    return tuple(_sum_to(gy * _const(first if i == 0 else ~first, gy.dtype),
                         (x1, x2)[i].shape) for i in indexes)


class Clip(FunctionNode):
    def __init__(self, x_min, x_max):
        self.x_min, self.x_max = x_min, x_max

    def forward(self, inputs):
        self.retain_inputs((0,))
        x, = inputs
        xp = backend.get_array_module(x)
        lo = None if self.x_min is None else x.dtype.type(self.x_min)
        hi = None if self.x_max is None else x.dtype.type(self.x_max)
        return xp.clip(x, lo, hi),

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        inside = x.xp.ones(x.shape, dtype=bool)
        if self.x_min is not None:
            inside &= x.array >= self.x_min
        if self.x_max is not None:
            inside &= x.array <= self.x_max
        return grad_outputs[0] * _const(inside, x.dtype),


def _unary(name, cls, x):
    check_float(name, x, 'x')
    return cls().apply((x,))[0]


def exp(x):
    """Elementwise exponential, ``y = e ** x``.

    Args:
        x (Variable or ndarray): float array of any shape.
    Returns:
        Variable of ``x``'s shape and dtype. ``dy/dx = y``.
    """
    return _unary('exp', Exp, x)


def log(x):
    """Elementwise natural logarithm, ``y = ln(x)`` (``x`` should be > 0).

    Args:
        x (Variable or ndarray): float array of any shape.
    Returns:
        Variable of ``x``'s shape and dtype. ``dy/dx = 1 / x``.
    """
    return _unary('log', Log, x)


def sqrt(x):
    """Elementwise square root, ``y = x ** 0.5`` (``x`` should be >= 0).

    Args:
        x (Variable or ndarray): float array of any shape.
    Returns:
        Variable of ``x``'s shape and dtype. ``dy/dx = 1 / (2 y)``.
    """
    return _unary('sqrt', Sqrt, x)


def square(x):
    """Elementwise square, ``y = x * x``.

    Args:
        x (Variable or ndarray): float array of any shape.
    Returns:
        Variable of ``x``'s shape and dtype. ``dy/dx = 2 x``.
    """
    return _unary('square', Square, x)


def absolute(x):
    """Elementwise absolute value, ``y = |x|``.

    Args:
        x (Variable or ndarray): float array of any shape.
    Returns:
        Variable of ``x``'s shape and dtype. ``dy/dx = sign(x)`` (0 at 0).
    """
    return _unary('absolute', Absolute, x)


def maximum(x1, x2):
    """Elementwise maximum of two arrays, ``y = max(x1, x2)``.

    Args:
        x1, x2 (Variable or ndarray): float arrays of one dtype whose shapes
            broadcast together (Chainer requires equal shapes; equal shapes
            are the common case).
    Returns:
        Variable of the broadcast shape. The gradient goes to ``x1`` where
        ``x1 >= x2`` and to ``x2`` elsewhere.
    """
    check_binary('maximum', x1, x2, check_float, ('x1', 'x2'))
    return Maximum().apply((x1, x2))[0]


def minimum(x1, x2):
    """Elementwise minimum of two arrays, ``y = min(x1, x2)``.

    Args:
        x1, x2 (Variable or ndarray): as in :func:`maximum`.
    Returns:
        Variable of the broadcast shape. The gradient goes to ``x1`` where
        ``x1 <= x2`` and to ``x2`` elsewhere.
    """
    check_binary('minimum', x1, x2, check_float, ('x1', 'x2'))
    return Minimum().apply((x1, x2))[0]


def clip(x, x_min, x_max):
    """Elementwise clipping, ``y = min(max(x, x_min), x_max)``.

    Args:
        x (Variable or ndarray): float array of any shape.
        x_min (float or None): lower bound (None: no lower bound).
        x_max (float or None): upper bound (None: no upper bound).
    Returns:
        Variable of ``x``'s shape and dtype. The gradient is passed where
        ``x_min <= x <= x_max`` and is zero elsewhere.
    Raises:
        ValueError when both bounds are None or ``x_min > x_max``.
    """
    check_float('clip', x, 'x')
    for name, bound in (('x_min', x_min), ('x_max', x_max)):
        if bound is not None and not isinstance(bound, (int, float,
                                                        numpy.number)):
            raise TypeError('clip: {} must be a scalar or None, got {}'
                            .format(name, type(bound).__name__))
    if x_min is None and x_max is None:
        raise ValueError('clip: x_min and x_max cannot both be None')
    if x_min is not None and x_max is not None and x_min > x_max:
        raise ValueError('clip: x_min ({}) must not exceed x_max ({})'
                         .format(x_min, x_max))
    return Clip(x_min, x_max).apply((x,))[0]
