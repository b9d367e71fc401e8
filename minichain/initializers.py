"""Initializers: objects that fill a parameter's array in place.

Random initializers draw from one module-level ``numpy.random.Generator``
created from a fixed seed, so the same script builds the same model on every
process (and on CPU or GPU: numbers are drawn on the host in float64, then
cast and copied). ``set_random_seed`` restarts that stream.

Fans follow Chainer: for a weight of shape ``(out, in, k1, k2, ...)``,
``fan_in = in * k1 * k2 * ...`` and ``fan_out = out * k1 * k2 * ...``.
"""
import numbers

import numpy

from minichain import backend
from minichain.configuration import get_dtype

DEFAULT_SEED = 20240101
_rng = numpy.random.default_rng(DEFAULT_SEED)


def set_random_seed(seed=DEFAULT_SEED):
    """Restart the shared generator from ``seed`` (an int)."""
    global _rng
    _rng = numpy.random.default_rng(seed)


def get_random_generator():
    """The shared ``numpy.random.Generator`` used when ``rng`` is None."""
    return _rng


def get_fans(shape):
    """``(fan_in, fan_out)`` of a weight ``shape`` with at least 2 axes."""
    if len(shape) < 2:
        raise ValueError('get_fans: a weight needs at least 2 axes to have '
                         'fans, got shape {}'.format(tuple(shape)))
    receptive = int(numpy.prod(shape[2:], dtype=numpy.int64))
    return shape[1] * receptive, shape[0] * receptive


class Initializer:
    """Base class: ``init(array)`` fills ``array`` (NumPy or CuPy) in place.

    Args:
        dtype: the dtype this initializer produces; None means the array's
            (``generate_array`` then uses ``config.dtype``).
        rng: a ``numpy.random.Generator``, an int seed, or None for the
            shared module generator (looked up at each call, so
            ``set_random_seed`` affects existing initializers).
    """

    def __init__(self, dtype=None, rng=None):
        self.dtype = None if dtype is None else numpy.dtype(dtype)
        if isinstance(rng, numbers.Integral):
            rng = numpy.random.default_rng(rng)
        self.rng = rng

    def __call__(self, array):
        if self.dtype is not None and array.dtype != self.dtype:
            raise TypeError('{}: array dtype {} differs from the '
                            'initializer dtype {}'.format(
                                type(self).__name__, array.dtype, self.dtype))
        values = self._values(array.shape)
        if backend.get_device_id(array) >= 0:
            with backend.cuda_device(backend.get_device_id(array)):
                array[...] = backend.to_gpu(
                    numpy.asarray(values).astype(array.dtype))
        else:
            array[...] = values

    def _values(self, shape):
        """Host values (anything broadcastable to ``shape``)."""
        raise NotImplementedError

    def _generator(self):
        return _rng if self.rng is None else self.rng

    def __repr__(self):
        args = ', '.join('{}={!r}'.format(k, v) for k, v in vars(self).items()
                         if k not in ('dtype', 'rng'))
        return '{}({})'.format(type(self).__name__, args)


class Constant(Initializer):
    """Fill with ``fill_value`` (a scalar, or an array broadcast to the
    shape)."""

    def __init__(self, fill_value, dtype=None):
        super().__init__(dtype)
        self.fill_value = fill_value

    def _values(self, shape):
        return backend.to_cpu(self.fill_value)


class Zero(Constant):
    """Fill with 0."""

    def __init__(self, dtype=None):
        super().__init__(0.0, dtype)


class One(Constant):
    """Fill with 1."""

    def __init__(self, dtype=None):
        super().__init__(1.0, dtype)


class NaN(Constant):
    """Fill with NaN: what a parameter created without initializer holds
    until something assigns it (as in Chainer)."""

    def __init__(self, dtype=None):
        super().__init__(numpy.nan, dtype)


class Normal(Initializer):
    """Draw from N(0, scale**2)."""

    def __init__(self, scale=0.05, dtype=None, rng=None):
        super().__init__(dtype, rng)
        self.scale = scale

    def _values(self, shape):
        return self._generator().normal(0.0, self.scale, size=shape)


class Uniform(Initializer):
    """Draw from U(-scale, scale)."""

    def __init__(self, scale=0.05, dtype=None, rng=None):
        super().__init__(dtype, rng)
        self.scale = scale

    def _values(self, shape):
        return self._generator().uniform(-self.scale, self.scale, size=shape)


class LeCunNormal(Initializer):
    """Draw from N(0, s**2) with ``s = scale * sqrt(1 / fan_in)``."""

    def __init__(self, scale=1.0, dtype=None, rng=None):
        super().__init__(dtype, rng)
        self.scale = scale

    def _values(self, shape):
        fan_in, _ = get_fans(shape)
        std = self.scale * numpy.sqrt(1.0 / fan_in)
        return self._generator().normal(0.0, std, size=shape)


class GlorotUniform(Initializer):
    """Draw from U(-s, s) with ``s = scale * sqrt(6 / (fan_in + fan_out))``."""

    def __init__(self, scale=1.0, dtype=None, rng=None):
        super().__init__(dtype, rng)
        self.scale = scale

    def _values(self, shape):
        fan_in, fan_out = get_fans(shape)
        s = self.scale * numpy.sqrt(6.0 / (fan_in + fan_out))
        return self._generator().uniform(-s, s, size=shape)


class HeNormal(Initializer):
    """Draw from N(0, s**2) with ``s = scale * sqrt(2 / fan)``, where ``fan``
    is ``fan_in`` or ``fan_out`` (``fan_option``)."""

    def __init__(self, scale=1.0, dtype=None, fan_option='fan_in', rng=None):
        if fan_option not in ('fan_in', 'fan_out'):
            raise ValueError("HeNormal: fan_option must be 'fan_in' or "
                             "'fan_out', got {!r}".format(fan_option))
        super().__init__(dtype, rng)
        self.scale = scale
        self.fan_option = fan_option

    def _values(self, shape):
        fan_in, fan_out = get_fans(shape)
        fan = fan_in if self.fan_option == 'fan_in' else fan_out
        std = self.scale * numpy.sqrt(2.0 / fan)
        return self._generator().normal(0.0, std, size=shape)


class _ArrayCopy(Initializer):
    """Copy a given array, cast to the parameter's dtype (the link's, as
    in Chainer: ``config.dtype`` unless the link says otherwise); shapes
    must match."""

    def __init__(self, array):
        super().__init__()
        self.array = backend.to_cpu(array).copy()

    def _values(self, shape):
        if tuple(shape) != self.array.shape:
            raise ValueError('initializer: array of shape {} cannot '
                             'initialize a parameter of shape {}'.format(
                                 self.array.shape, tuple(shape)))
        return self.array

    def __repr__(self):
        return 'array(shape={}, dtype={})'.format(self.array.shape,
                                                   self.array.dtype)


def get_initializer(value, default=None, dtype=None):
    """Turn a link's ``initialW``-style argument into an initializer.

    Args:
        value: None (gives ``default``), a scalar (``Constant(value,
            dtype)``), an array (copied now, and cast to the parameter's
            dtype when it is created) or an initializer / callable
            (returned as is).
        default: what None stands for.
        dtype: dtype given to a scalar's Constant.
    Returns:
        an object ``generate_array`` accepts.
    """
    if value is None:
        return default
    if backend.is_array(value):
        return _ArrayCopy(value)
    if isinstance(value, (numbers.Number, numpy.generic)):
        return Constant(value, dtype)
    if callable(value):
        return value
    raise TypeError('initializer: expected an initializer, a scalar or an '
                    'array, got {}'.format(type(value).__name__))


def generate_array(initializer, shape, xp, dtype=None):
    """Create an array of ``shape`` on ``xp`` filled by ``initializer``.

    Args:
        initializer: an initializer (or callable filling an array), a scalar
            (a constant), an ndarray (copied and cast; its shape must equal
            ``shape``) or None (NaN-filled, as Chainer).
        shape: int or tuple.
        xp: ``numpy`` or ``cupy``.
        dtype: the result's dtype; None means the initializer's own, else
            ``config.dtype`` (float32 under ``'mixed16'``: the parameters
            are the float32 master copy). It must agree with an
            initializer's dtype.
    Returns:
        the new ndarray.
    Raises:
        ValueError: the dtypes disagree, or an array's shape differs.
    """
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    if initializer is None:
        initializer = NaN()
    elif not isinstance(initializer, Initializer):
        initializer = get_initializer(initializer, dtype=dtype)
    own = getattr(initializer, 'dtype', None)
    if dtype is not None and own is not None and numpy.dtype(dtype) != own:
        raise ValueError('generate_array: requested dtype {} differs from '
                         'the initializer dtype {}'.format(
                             numpy.dtype(dtype), own))
    if dtype is None:
        dtype = own if own is not None else get_dtype(
            map_mixed16=numpy.float32)
    array = xp.empty(shape, dtype=dtype)
    initializer(array)
    return array
