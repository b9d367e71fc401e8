"""Activations: identity, relu, leaky_relu, sigmoid, tanh, softmax and
log_softmax.

Where the output determines the derivative (relu, sigmoid, tanh, softmax,
log_softmax) backward reads the retained *output*, and the graph keeps no
reference to the input's array: in ``F.relu(conv(x))`` the convolution's
output is freed as soon as relu has run (docs/tape.md shows it).
"""
from minichain import backend
from minichain.function_node import FunctionNode
from minichain.functions import math as _math
from minichain.functions import reduction as _reduction
from minichain.functions.array import Identity
from minichain.functions._check import check_float, normalize_axis, unwrap

__all__ = ['identity', 'relu', 'leaky_relu', 'sigmoid', 'tanh', 'softmax',
           'log_softmax']


def identity(*inputs):
    """Pass the inputs through unchanged, as new nodes of the graph.

    Args:
        *inputs: Variables or ndarrays of any shapes.
    Returns:
        One Variable when one input is given, else a tuple of Variables, each
        with the shape and values of the matching input.
    """
    if not inputs:
        raise ValueError('identity: needs at least one input')
    for i, x in enumerate(inputs):
        xa = unwrap(x)
        if not backend.is_array(xa):
            raise TypeError('identity: input {} must be a Variable or '
                            'ndarray, got {}'.format(i, type(x).__name__))
    ys = Identity().apply(inputs)
    return ys[0] if len(ys) == 1 else ys


class ReLU(FunctionNode):
    def forward(self, inputs):
        x, = inputs
        self.retain_outputs((0,))
        xp = backend.get_array_module(x)
        return xp.maximum(x, x.dtype.type(0)),

    def backward(self, indexes, grad_outputs):
        y, = self.get_retained_outputs()
        return ReLUGrad().apply((y, grad_outputs[0]))


class ReLUGrad(FunctionNode):
    """``gx = gy * (y > 0)``: relu's backward, differentiable in ``gy``.

    Inputs are ``(y, gy)``. The mask is a step function of ``y``, so the
    gradient w.r.t. ``y`` is zero almost everywhere (returned as None).
    """

    def forward(self, inputs):
        self.retain_inputs((0,))
        y, gy = inputs
        return gy * (y > 0),

    def backward(self, indexes, grad_outputs):
        y, = self.get_retained_inputs()
        ggx, = grad_outputs
        return tuple(None if i == 0 else ReLUGrad().apply((y, ggx))[0]
                     for i in indexes)


def relu(x):
    """Rectified linear unit, ``y = max(x, 0)`` elementwise.

    Args:
        x: float Variable or ndarray of any shape.
    Returns:
        Variable of ``x.shape``. The derivative at 0 is taken as 0.
    """
    check_float('relu', x, 'x')
    return ReLU().apply((x,))[0]


class LeakyReLU(FunctionNode):
    def __init__(self, slope):
        self.slope = slope

    def forward(self, inputs):
        x, = inputs
        # With a non-negative slope y > 0 exactly where x > 0, so the output
        # can serve as the mask and the input may be freed.
        if self.slope >= 0:
            self.retain_outputs((0,))
        else:
            self.retain_inputs((0,))
        xp = backend.get_array_module(x)
        return xp.where(x > 0, x, x * x.dtype.type(self.slope)),

    def backward(self, indexes, grad_outputs):
        if self.slope >= 0:
            a, = self.get_retained_outputs()
        else:
            a, = self.get_retained_inputs()
        return LeakyReLUGrad(self.slope).apply((a, grad_outputs[0]))


class LeakyReLUGrad(FunctionNode):
    """``gx = gy`` where ``a > 0``, else ``slope * gy``; inputs ``(a, gy)``."""

    def __init__(self, slope):
        self.slope = slope

    def forward(self, inputs):
        self.retain_inputs((0,))
        a, gy = inputs
        xp = backend.get_array_module(gy)
        return xp.where(a > 0, gy, gy * gy.dtype.type(self.slope)),

    def backward(self, indexes, grad_outputs):
        a, = self.get_retained_inputs()
        ggx, = grad_outputs
        return tuple(None if i == 0 else
                     LeakyReLUGrad(self.slope).apply((a, ggx))[0]
                     for i in indexes)


def leaky_relu(x, slope=0.2):
    """Leaky ReLU, ``y = x`` for ``x > 0`` and ``slope * x`` otherwise.

    Args:
        x: float Variable or ndarray of any shape.
        slope: the gradient for negative inputs (a Python number).
    Returns:
        Variable of ``x.shape``.
    """
    check_float('leaky_relu', x, 'x')
    if not isinstance(slope, (int, float)):
        raise TypeError('leaky_relu: slope must be a number, got {}'
                        .format(type(slope).__name__))
    return LeakyReLU(float(slope)).apply((x,))[0]


class Sigmoid(FunctionNode):
    def forward(self, inputs):
        x, = inputs
        self.retain_outputs((0,))
        xp = backend.get_array_module(x)
        half = x.dtype.type(0.5)
        # tanh form: no overflow of exp(-x) for large negative x.
        return xp.tanh(x * half) * half + half,

    def backward(self, indexes, grad_outputs):
        y, = self.get_retained_outputs()
        return grad_outputs[0] * y * (1 - y),


def sigmoid(x):
    """Logistic sigmoid, ``y = 1 / (1 + exp(-x))`` elementwise.

    Args:
        x: float Variable or ndarray of any shape.
    Returns:
        Variable of ``x.shape`` with values in (0, 1).
    """
    check_float('sigmoid', x, 'x')
    return Sigmoid().apply((x,))[0]


class Tanh(FunctionNode):
    def forward(self, inputs):
        x, = inputs
        self.retain_outputs((0,))
        xp = backend.get_array_module(x)
        return xp.tanh(x),

    def backward(self, indexes, grad_outputs):
        y, = self.get_retained_outputs()
        return grad_outputs[0] * (1 - y * y),


def tanh(x):
    """Hyperbolic tangent elementwise; ``dy/dx = 1 - y ** 2``.

    Args:
        x: float Variable or ndarray of any shape.
    Returns:
        Variable of ``x.shape`` with values in (-1, 1).
    """
    check_float('tanh', x, 'x')
    return Tanh().apply((x,))[0]


def _log_sum_exp_shifted(x, axis):
    """``(x - max, log(sum(exp(x - max))))`` along ``axis``, kept dims."""
    xp = backend.get_array_module(x)
    z = x - x.max(axis=axis, keepdims=True)
    return z, xp.log(xp.exp(z).sum(axis=axis, keepdims=True))


class Softmax(FunctionNode):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, inputs):
        x, = inputs
        self.retain_outputs((0,))
        xp = backend.get_array_module(x)
        e = xp.exp(x - x.max(axis=self.axis, keepdims=True))
        return e / e.sum(axis=self.axis, keepdims=True),

    def backward(self, indexes, grad_outputs):
        # gx = y * gy - y * sum(y * gy): softmax's Jacobian-vector product.
        y, = self.get_retained_outputs()
        ygy = y * grad_outputs[0]
        return ygy - y * _reduction.sum(ygy, axis=self.axis, keepdims=True),


def _softmax_axis(name, x, axis):
    xa = check_float(name, x, 'x')
    if xa.ndim == 0:
        raise ValueError('{}: input must have at least one axis, got shape {}'
                         .format(name, xa.shape))
    if not isinstance(axis, int):
        raise TypeError('{}: axis must be an int, got {}'
                        .format(name, type(axis).__name__))
    return normalize_axis(name, axis, xa.ndim)[0]


def softmax(x, axis=1):
    """Softmax along ``axis``: ``y_i = exp(x_i) / sum_j exp(x_j)``.

    Computed after subtracting the maximum along ``axis``, so large inputs
    do not overflow.

    Args:
        x: float Variable or ndarray, e.g. logits of shape (N, C) or
            (N, C, H, W).
        axis: the axis normalized over (default 1, the channel axis).
    Returns:
        Variable of ``x.shape``; entries along ``axis`` sum to 1.
    """
    axis = _softmax_axis('softmax', x, axis)
    return Softmax(axis).apply((x,))[0]


class LogSoftmax(FunctionNode):
    def __init__(self, axis):
        self.axis = axis

    def forward(self, inputs):
        x, = inputs
        self.retain_outputs((0,))
        z, lse = _log_sum_exp_shifted(x, self.axis)
        return z - lse,

    def backward(self, indexes, grad_outputs):
        # gx = gy - softmax(x) * sum(gy), with softmax(x) = exp(y).
        y, = self.get_retained_outputs()
        gy = grad_outputs[0]
        sum_gy = _reduction.sum(gy, axis=self.axis, keepdims=True)
        return gy - _math.exp(y) * sum_gy,


def log_softmax(x, axis=1):
    """Logarithm of the softmax along ``axis``: ``y = x - logsumexp(x)``.

    More accurate than ``log(softmax(x))``: tiny probabilities do not round
    to zero before the log.

    Args:
        x: float Variable or ndarray (e.g. logits (N, C) or (N, C, H, W)).
        axis: the axis normalized over (default 1).
    Returns:
        Variable of ``x.shape`` whose ``exp`` sums to 1 along ``axis``.
    """
    axis = _softmax_axis('log_softmax', x, axis)
    return LogSoftmax(axis).apply((x,))[0]
