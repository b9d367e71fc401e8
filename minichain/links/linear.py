"""The fully connected layer: L.Linear."""
import numpy

from minichain import functions as F
from minichain import initializers
from minichain.links import _mixed16
from minichain.link import Link
from minichain.variable import Parameter

__all__ = ['Linear']


def _dtype_of(init):
    """The dtype an initializer fixes (None when it leaves it open)."""
    dtype = getattr(init, 'dtype', None)
    return None if dtype is None else numpy.dtype(dtype)


def _weight_and_bias(initialW, initial_bias, nobias, out_size, w_shape):
    """``(W, b)``: W of ``initialW`` (default ``LeCunNormal()``; created now
    when ``w_shape`` is not None), then b: None with ``nobias``, else
    ``(out_size,)`` of ``initial_bias`` (default 0), a scalar or the
    default in ``W``'s dtype when ``initialW`` fixes one."""
    w_init = initializers.get_initializer(
        initialW, default=initializers.LeCunNormal())
    dtype = _dtype_of(w_init)
    W = Parameter(w_init, w_shape)
    return W, None if nobias else Parameter(initializers.get_initializer(
        initial_bias, initializers.Zero(dtype), dtype), (out_size,))


class Linear(Link):
    """A fully connected layer: ``y = x W^T + b``.

    Args:
        in_size: input size, or None to infer it from the first input
            (lazy initialization; trailing axes are flattened, so an
            ``(N, C, 1, 1)`` input has ``in_size = C``).
        out_size: output size. ``Linear(out_size)`` is short for
            ``Linear(None, out_size)``, as in Chainer.
        nobias: if True, no bias ``b``.
        initialW: initializer, scalar or array for ``W``; default
            ``LeCunNormal()``.
        initial_bias: initializer, scalar or array for ``b``; default 0.
            A scalar or the default takes ``W``'s dtype when ``initialW``
            fixes one (an array or an initializer with a dtype).

    Attributes:
        W: Parameter of shape ``(out_size, in_size)``.
        b: Parameter of shape ``(out_size,)``, or None.

    Input ``(N, ...)`` with ``prod(...) == in_size``; output ``(N, out_size)``.
    """

    def __init__(self, in_size, out_size=None, nobias=False, initialW=None,
                 initial_bias=None):
        super().__init__()
        if out_size is None:
            in_size, out_size = None, in_size
        self.in_size, self.out_size, self.nobias = in_size, out_size, nobias
        with self.init_scope():
            self.W, self.b = _weight_and_bias(
                initialW, initial_bias, nobias, out_size,
                None if in_size is None else (out_size, in_size))

    def forward(self, x):
        """Apply the layer to ``x`` of shape ``(N, ...)``."""
        if not self.W.is_initialized:
            self.in_size = int(numpy.prod(x.shape[1:], dtype=numpy.int64))
            self.W.initialize((self.out_size, self.in_size))
        return F.linear(*_mixed16.half(x, self.W, self.b))

    def _repr_args(self):
        return 'in_size={}, out_size={}, nobias={}'.format(
            self.in_size, self.out_size, self.nobias)
