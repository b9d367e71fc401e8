"""Arithmetic: add, sub, mul, div, neg, pow, matmul, and Variable's operators.

Binary ops broadcast like NumPy; their backward sums each gradient back to
its input's shape with the one shared ``sum_to``.
"""
import numpy

from minichain import backend
from minichain.function_node import FunctionNode
from minichain.variable import Variable, as_array
from minichain.functions import array as _array
from minichain.functions._check import check_array, check_binary

__all__ = ['add', 'sub', 'mul', 'div', 'neg', 'pow', 'matmul']


def _sum_to(gy, shape):
    """sum_to, skipped when no broadcasting happened (the common case)."""
    return gy if gy.shape == shape else _array.sum_to(gy, shape)


class Add(FunctionNode):
    def forward(self, inputs):
        a, b = inputs
        self.shapes = (a.shape, b.shape)
        return a + b,

    def backward(self, indexes, grad_outputs):
        gy, = grad_outputs
        return tuple(_sum_to(gy, self.shapes[i]) for i in indexes)


class Sub(FunctionNode):
    def forward(self, inputs):
        a, b = inputs
        self.shapes = (a.shape, b.shape)
        return a - b,

    def backward(self, indexes, grad_outputs):
        gy, = grad_outputs
        return tuple(_sum_to(gy if i == 0 else -gy, self.shapes[i])
                     for i in indexes)


class Mul(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0, 1))
        a, b = inputs
        return a * b,

    def backward(self, indexes, grad_outputs):
        a, b = self.get_retained_inputs()
        gy, = grad_outputs
        return tuple(_sum_to(gy * (b if i == 0 else a), (a, b)[i].shape)
                     for i in indexes)


class Div(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0, 1))
        a, b = inputs
        return a / b,

    def backward(self, indexes, grad_outputs):
        a, b = self.get_retained_inputs()
        gy, = grad_outputs
        ga = gy / b
        return tuple(_sum_to(ga, a.shape) if i == 0 else
                     _sum_to(-ga * a / b, b.shape) for i in indexes)


class Neg(FunctionNode):
    def forward(self, inputs):
        return -inputs[0],

    def backward(self, indexes, grad_outputs):
        return -grad_outputs[0],


class Pow(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0, 1))
        a, b = inputs
        return a ** b,

    def backward(self, indexes, grad_outputs):
        from minichain.functions.math import log
        a, b = self.get_retained_inputs()
        gy, = grad_outputs
        return tuple(_sum_to(gy * b * a ** (b - 1), a.shape) if i == 0 else
                     _sum_to(gy * a ** b * log(a), b.shape) for i in indexes)


class PowConst(FunctionNode):
    """x ** c for a scalar constant c (the common case: no log needed)."""

    def __init__(self, c):
        self.c = c

    def forward(self, inputs):
        self.retain_inputs((0,))
        x, = inputs
        return x ** x.dtype.type(self.c),

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        c = self.c
        if c == 0:  # x ** -1 would turn the zero gradient into NaN at x == 0
            return grad_outputs[0] * 0,
        return grad_outputs[0] * (c * x ** (c - 1)),


class MatMul(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0, 1))
        a, b = inputs
        # astype: NumPy's matmul of ml_dtypes' bfloat16 returns float32
        return (a @ b).astype(a.dtype, copy=False),

    def backward(self, indexes, grad_outputs):
        a, b = self.get_retained_inputs()
        gy, = grad_outputs
        # Treat a 1-D a as (1, k) and a 1-D b as (k, 1), and give gy back the
        # axes that matmul dropped for them; then one formula covers all.
        a2 = _array.expand_dims(a, 0) if a.ndim == 1 else a
        b2 = _array.expand_dims(b, -1) if b.ndim == 1 else b
        if b.ndim == 1:
            gy = _array.expand_dims(gy, -1)
        if a.ndim == 1:
            gy = _array.expand_dims(gy, -2)
        result = []
        for i in indexes:
            if i == 0:
                g = _sum_to(matmul(gy, _swap_last(b2)), a2.shape)
            else:
                g = _sum_to(matmul(_swap_last(a2), gy), b2.shape)
            x = (a, b)[i]
            result.append(g if g.shape == x.shape else
                          _array.reshape(g, x.shape))
        return tuple(result)


def _swap_last(x):
    axes = list(range(x.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return _array.transpose(x, axes)


def add(a, b):
    """Elementwise ``a + b`` with NumPy broadcasting.

    Args:
        a, b (Variable or ndarray): one dtype, broadcastable shapes (the
            operators ``x + 2`` or ``ndarray + x`` cast the constant to the
            Variable's dtype first).
    Returns:
        Variable of the broadcast shape.
    Raises:
        TypeError when the dtypes differ; ValueError naming both shapes when
        they do not broadcast.
    """
    check_binary('add', a, b)
    return Add().apply((a, b))[0]


def sub(a, b):
    """Elementwise ``a - b`` with broadcasting (shapes as in :func:`add`)."""
    check_binary('sub', a, b)
    return Sub().apply((a, b))[0]


def mul(a, b):
    """Elementwise ``a * b`` with broadcasting (shapes as in :func:`add`)."""
    check_binary('mul', a, b)
    return Mul().apply((a, b))[0]


def div(a, b):
    """Elementwise ``a / b`` with broadcasting (shapes as in :func:`add`)."""
    check_binary('div', a, b)
    return Div().apply((a, b))[0]


def neg(x):
    """Elementwise ``-x``; output shape equals ``x.shape``."""
    check_array('neg', x, 'x')
    return Neg().apply((x,))[0]


def pow(a, b):
    """Elementwise ``a ** b``.

    ``b`` may be a Python or NumPy scalar (fast path, no gradient for it) or
    a broadcastable Variable/array of ``a``'s dtype (then ``a`` should be
    positive, since the gradient w.r.t. ``b`` is ``a ** b * log(a)``).
    Output shape: the broadcast shape.
    """
    if _is_scalar(b):
        check_array('pow', a, 'base')
        return PowConst(b.item() if isinstance(b, numpy.generic) else b
                        ).apply((a,))[0]
    check_binary('pow', a, b)
    return Pow().apply((a, b))[0]


def matmul(a, b):
    """Matrix product ``a @ b`` with NumPy's rules (batched over leading axes).

    Args:
        a: (..., m, k) or (k,); b: (..., k, n) or (k,).
    Returns:
        Variable of shape (..., m, n) (1-D operands drop their axis).
    Raises:
        ValueError naming both shapes when the inner dimensions differ.
    """
    a_arr, b_arr = check_array('matmul', a, 'a'), check_array('matmul', b, 'b')
    if a_arr.ndim == 0 or b_arr.ndim == 0:
        raise ValueError('matmul: operands must have at least one axis, got '
                         'shapes {} and {}'.format(a_arr.shape, b_arr.shape))
    ka = a_arr.shape[-1]
    kb = b_arr.shape[0] if b_arr.ndim == 1 else b_arr.shape[-2]
    if ka != kb:
        raise ValueError('matmul: inner dimensions differ: {} @ {} ({} != {})'
                         .format(a_arr.shape, b_arr.shape, ka, kb))
    try:
        numpy.broadcast_shapes(a_arr.shape[:-2], b_arr.shape[:-2])
    except ValueError:
        raise ValueError('matmul: batch axes of {} and {} do not broadcast'
                         .format(a_arr.shape, b_arr.shape)) from None
    if a_arr.dtype != b_arr.dtype:
        raise TypeError('matmul: dtypes differ: {} and {}'
                        .format(a_arr.dtype, b_arr.dtype))
    return MatMul().apply((a, b))[0]


# -- Variable operators --------------------------------------------------------
def _is_scalar(x):
    return isinstance(x, (int, float, numpy.generic))


def _inexact(dtype):
    return dtype.kind == 'c' or backend.is_float(dtype)


def _operand(other, like, name):
    """A Variable stays itself; scalars and arrays take ``like``'s dtype.

    Chainer casts constants the same way, so ``x * 2`` and
    ``float64_array * x`` keep ``x`` float32. A Variable of integers (or
    booleans) takes only constants that the cast leaves unchanged: ``x *
    0.5`` would multiply by 0 (NumPy would promote to float, Chainer casts
    silently); it is refused, naming the operator (``name``).
    """
    if isinstance(other, Variable):
        return other
    if not (backend.is_array(other) or _is_scalar(other)):
        return NotImplemented  # Python then raises its usual TypeError
    try:
        cast = (other.astype(like.dtype, copy=False) if backend.is_array(
            other) else as_array(other, like.array))
        changed = not _inexact(like.dtype) and bool((cast != other).any())
    except OverflowError:  # NumPy 2: a Python int outside the dtype's range
        changed = True
    if changed:
        raise TypeError(
            '{}: {} {} would change in the Variable\'s dtype {} (operators '
            'cast constants to the Variable\'s dtype, which keeps 0.5 as 0 '
            'for integers): make the Variable floating point first, e.g. '
            'Variable(x.array.astype(numpy.float32))'.format(
                name, 'the constant' if _is_scalar(other) else 'an array of',
                other if _is_scalar(other) else other.dtype, like.dtype))
    return cast


def _operator(op, reflected=False):
    """``self <op> other`` as a method (``other <op> self`` if reflected)."""
    def method(self, other):
        other = _operand(other, self, op.__name__)
        if other is NotImplemented:
            return other
        return op(other, self) if reflected else op(self, other)
    return method


def _pow_method(self, other):
    if _is_scalar(other) and _inexact(self.dtype):
        return pow(self, other)
    other = _operand(other, self, 'pow')
    return other if other is NotImplemented else pow(self, other)


def install_variable_operators():
    """Give Variable its arithmetic operators (called once at import)."""
    from minichain.functions.array import get_item, transpose, reshape
    Variable.__add__ = _operator(add)
    Variable.__radd__ = _operator(add, reflected=True)
    Variable.__sub__ = _operator(sub)
    Variable.__rsub__ = _operator(sub, reflected=True)
    Variable.__mul__ = _operator(mul)
    Variable.__rmul__ = _operator(mul, reflected=True)
    Variable.__truediv__ = _operator(div)
    Variable.__rtruediv__ = _operator(div, reflected=True)
    Variable.__pow__ = _pow_method
    Variable.__rpow__ = _operator(pow, reflected=True)
    Variable.__matmul__ = _operator(matmul)
    Variable.__rmatmul__ = _operator(matmul, reflected=True)
    Variable.__neg__ = neg
    Variable.__pos__ = lambda self: self
    Variable.__getitem__ = get_item
    Variable.T = property(lambda self: transpose(self))

    def _reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        return reshape(self, tuple(shape))

    def _transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = axes[0]
        return transpose(self, tuple(axes) if axes else None)

    Variable.reshape = _reshape
    Variable.transpose = _transpose
