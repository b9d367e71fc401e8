"""The fully connected layer's function: linear."""
import numpy

from minichain.function_node import FunctionNode
from minichain.functions import array as _array
from minichain.functions import basic_math as _basic_math
from minichain.functions import reduction as _reduction
from minichain.functions._check import check_float, check_same_dtype

__all__ = ['linear']


class LinearFunction(FunctionNode):
    """``y = x @ W.T (+ b)`` for a 2-D ``x``; inputs ``(x, W[, b])``."""

    def forward(self, inputs):
        self.retain_inputs((0, 1))
        x, W = inputs[:2]
        # astype: NumPy's matmul of ml_dtypes' bfloat16 returns float32
        y = (x @ W.T).astype(x.dtype, copy=False)
        if len(inputs) == 3:
            y += inputs[2]  # y is a fresh array: adding in place is safe
        return y,

    def backward(self, indexes, grad_outputs):
        x, W = self.get_retained_inputs()
        gy, = grad_outputs
        result = []
        for i in indexes:
            if i == 0:
                result.append(_basic_math.matmul(gy, W))
            elif i == 1:
                result.append(_basic_math.matmul(_array.transpose(gy), x))
            else:
                result.append(_reduction.sum(gy, axis=0))
        return tuple(result)


def linear(x, W, b=None, n_batch_axes=1):
    """Affine map ``y = x W^T + b``.

    The first ``n_batch_axes`` axes of ``x`` are batch axes; the remaining
    ones are flattened into the feature axis (so a (N, C, H, W) feature map
    feeds a layer with ``in_size = C * H * W``).

    Args:
        x: float array of shape (N, in_size), or (batch..., d1, d2, ...) with
            ``d1 * d2 * ... == in_size``.
        W: weight of shape (out_size, in_size), same dtype as ``x``.
        b: optional bias of shape (out_size,).
        n_batch_axes: how many leading axes of ``x`` are batch axes.
    Returns:
        Variable of shape ``x.shape[:n_batch_axes] + (out_size,)``.
    """
    name = 'linear'
    xa, Wa = check_float(name, x, 'x'), check_float(name, W, 'W')
    if not isinstance(n_batch_axes, int) or n_batch_axes < 1:
        raise ValueError('{}: n_batch_axes must be a positive int, got {!r}'
                         .format(name, n_batch_axes))
    if xa.ndim <= n_batch_axes:
        raise ValueError('{}: x of shape {} needs more than n_batch_axes={} '
                         'axes'.format(name, xa.shape, n_batch_axes))
    if Wa.ndim != 2:
        raise ValueError('{}: W must be 2-D (out_size, in_size), got shape {}'
                         .format(name, Wa.shape))
    batch_shape = xa.shape[:n_batch_axes]
    in_size = int(numpy.prod(xa.shape[n_batch_axes:]))
    if in_size != Wa.shape[1]:
        raise ValueError('{}: x of shape {} has in_size {} but W of shape {} '
                         'expects {}'.format(name, xa.shape, in_size, Wa.shape,
                                             Wa.shape[1]))
    inputs = (x, W)
    arrays = (xa, Wa)
    if b is not None:
        ba = check_float(name, b, 'b')
        if ba.shape != (Wa.shape[0],):
            raise ValueError('{}: b must have shape ({},) to match W of shape '
                             '{}, got {}'.format(name, Wa.shape[0], Wa.shape,
                                                 ba.shape))
        inputs += (b,)
        arrays += (ba,)
    check_same_dtype(name, *arrays)
    if xa.ndim != 2:
        x = _array.reshape(x, (int(numpy.prod(batch_shape)), in_size))
        inputs = (x,) + inputs[1:]
    y, = LinearFunction().apply(inputs)
    if len(batch_shape) != 1:
        y = _array.reshape(y, batch_shape + (Wa.shape[0],))
    return y
