"""Input validation shared by the functions: errors name the function and shapes.

A bad shape caught here gives ``matmul: inner dimensions differ: (2, 3) @ (4, 5)``
instead of a NumPy traceback from deep inside a forward.
"""
import numpy

from minichain import backend


def check_array(func_name, x, what='input'):
    """The array of ``x`` (a Variable or ndarray); TypeError unless it is
    an ndarray with a numeric dtype."""
    x = unwrap(x)
    if not backend.is_array(x):
        raise TypeError('{}: {} must be a Variable or ndarray, got {}'
                        .format(func_name, what, type(x).__name__))
    if x.dtype.kind not in 'biufc' and not backend.is_float(x.dtype):
        raise TypeError('{}: {} has unsupported dtype {}'
                        .format(func_name, what, x.dtype))
    return x


def check_float(func_name, x, what='input'):
    """The array of ``x``; TypeError unless it is floating point."""
    x = check_array(func_name, x, what)
    if not backend.is_float(x.dtype):
        raise TypeError('{}: {} must be floating point, got dtype {}'
                        .format(func_name, what, x.dtype))
    return x


def check_same_dtype(func_name, *arrays):
    """Raise TypeError when the arrays' dtypes differ."""
    dtypes = [a.dtype for a in arrays]
    if any(d != dtypes[0] for d in dtypes):
        raise TypeError('{}: inputs must share one dtype, got {}'
                        .format(func_name, ', '.join(map(str, dtypes))))


def check_broadcastable(func_name, *shapes):
    """Raise ValueError when ``shapes`` do not broadcast together."""
    ndim = max(len(s) for s in shapes)
    for axis in range(1, ndim + 1):
        sizes = {s[-axis] for s in shapes if len(s) >= axis} - {1}
        if len(sizes) > 1:
            raise ValueError('{}: shapes {} cannot be broadcast together'
                             .format(func_name,
                                     ' and '.join(str(s) for s in shapes)))


def check_binary(func_name, a, b, check=check_array,
                 names=('first operand', 'second operand')):
    """The checks of a broadcasting binary op on Variables or ndarrays:
    ``check`` on each operand (``check_array`` or ``check_float``), one
    dtype, broadcastable shapes."""
    a, b = check(func_name, a, names[0]), check(func_name, b, names[1])
    check_same_dtype(func_name, a, b)
    check_broadcastable(func_name, a.shape, b.shape)


def check_int_axis(func_name, axis):
    """Raise TypeError unless ``axis`` is an int (not a bool)."""
    if not isinstance(axis, (int, numpy.integer)) or isinstance(axis, bool):
        raise TypeError('{}: axis must be an int, got {!r}'
                        .format(func_name, axis))


def check_axis(func_name, axis, ndim, shape):
    """Validate an int axis of an input of ``shape``; return it normalised."""
    check_int_axis(func_name, axis)
    if not -ndim <= axis < ndim:
        raise ValueError('{}: axis {} is out of range for shape {}'
                         .format(func_name, axis, shape))
    return int(axis) % ndim


def normalize_axis(func_name, axis, ndim):
    """Normalise ``axis`` (None, int or tuple) to a sorted tuple, or None."""
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError('{}: axis {} is out of range for an input with '
                             '{} dimensions'.format(func_name, a, ndim))
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError('{}: repeated axis in {}'.format(func_name, axis))
    return tuple(sorted(out))


def check_pair(func_name, name, v, minimum):
    """An int or a pair of ints, each >= minimum, as a tuple of two ints."""
    pair = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(pair) != 2 or any(int(p) != p or p < minimum for p in pair):
        raise ValueError('{}: {} must be an int or a pair of ints >= {}, '
                         'got {!r}'.format(func_name, name, minimum, v))
    return tuple(int(p) for p in pair)


def check_image(func_name, x):
    """The array of ``x``, checked to be a float (N, C, H, W) batch."""
    xa = check_float(func_name, x, 'x')
    if xa.ndim != 4:
        raise ValueError('{}: x must be 4-D (N, C, H, W), got shape {}'
                         .format(func_name, xa.shape))
    return xa


def unwrap(x):
    """The array of a Variable, or ``x`` itself."""
    return getattr(x, 'array', x)
