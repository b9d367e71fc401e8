"""Reductions: sum, mean, max, min, logsumexp."""
from minichain.function_node import FunctionNode
from minichain.functions import array as _array
from minichain.functions._check import check_array, normalize_axis, unwrap

__all__ = ['sum']


def _keepdims_shape(in_shape, axis):
    """The shape of a reduction over ``axis`` with keepdims=True."""
    if axis is None:
        return (1,) * len(in_shape)
    return tuple(1 if i in axis else s for i, s in enumerate(in_shape))


class Sum(FunctionNode):
    def __init__(self, axis, keepdims):
        self.axis, self.keepdims = axis, keepdims

    def forward(self, inputs):
        x, = inputs
        self.in_shape = x.shape
        return x.sum(axis=self.axis, keepdims=self.keepdims),

    def backward(self, indexes, grad_outputs):
        gy, = grad_outputs
        if not self.keepdims:
            gy = _array.reshape(gy, _keepdims_shape(self.in_shape, self.axis))
        return _array.broadcast_to(gy, self.in_shape),


def sum(x, axis=None, keepdims=False):
    """Sum of elements over ``axis`` (None: all axes).

    Args:
        x: Variable or ndarray of any shape.
        axis: None, an int or a tuple of ints (negative values allowed).
        keepdims: keep reduced axes with length 1.
    Returns:
        Variable with the reduced axes removed (or of length 1).
    """
    xa = unwrap(x)
    check_array('sum', xa, 'x')
    axis = normalize_axis('sum', axis, xa.ndim)
    return Sum(axis, keepdims).apply((x,))[0]
