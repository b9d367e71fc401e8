"""Direct calls into the BLAS that NumPy loaded, for what NumPy cannot say.

NumPy rounds and stores after every ufunc, so an expression of several
operations is several passes over memory. MomentumSGD's update, ``v =
momentum * v - lr * g`` and then ``p += v``, is four of them, ten reads and
writes of a parameter's size (a temporary holds ``lr * g``). BLAS's
``axpby`` (``y = a x + b y``) and ``axpy`` (``y += a x``) do it in two, six
reads and writes: over ResNet-50's 25.5 million parameters, on one flat
array, 30 ms against 56 ms on one thread and 16 ms against 30 ms on two
(2026-12-01, bench/README.md).

The library is the BLAS that threadpoolctl finds in this process (NumPy's
OpenBLAS). Its CBLAS entry points are looked up under the names NumPy's
wheels give them (``scipy_cblas_saxpby64_``, 64-bit integers), those of a
64-bit-integer OpenBLAS (``cblas_saxpby64_``) and those of a plain one
(``cblas_saxpby``, whose integer width its build string tells). A first
call on a small case checks them against NumPy. Any other BLAS, or
``MINICHAIN_DIRECT_BLAS=0`` in the environment, leaves :func:`axpby`
returning False, and the callers do the NumPy passes instead.

ctypes releases Python's lock during the call, so the calls run on several
of minichain's threads at once (``_parallel.py``), each with the BLAS on
one thread (:func:`minichain.host.cpu_kernel_scope`).
"""
import ctypes
import os

import numpy

_PREFIX = {numpy.dtype(numpy.float32): 's', numpy.dtype(numpy.float64): 'd'}
_SCALAR = {'s': ctypes.c_float, 'd': ctypes.c_double}
_routines = None  # {name: ctypes function}, {} when there are none


def _library_routines():
    """``{'saxpby': f, 'daxpy': f, ...}`` from the process's OpenBLAS, or
    ``{}``."""
    if os.environ.get('MINICHAIN_DIRECT_BLAS', '1') == '0':
        return {}
    from minichain import host
    for lib in host._blas_libraries():
        if lib.internal_api != 'openblas':
            continue
        dll = ctypes.CDLL(lib.filepath)
        for pattern, index in (('scipy_cblas_{}64_', ctypes.c_int64),
                               ('cblas_{}64_', ctypes.c_int64),
                               ('cblas_{}', None)):
            found = _bind(dll, pattern, index)
            if found:
                return found
    return {}


def _bind(dll, pattern, index):
    """The routines under ``pattern`` (axpby and axpy, single and double
    precision), typed, or None if one is missing or the integer width
    cannot be told."""
    if index is None:  # a plain OpenBLAS: its build string names ILP64
        config = getattr(dll, 'openblas_get_config', None)
        if config is None:
            return None
        config.restype = ctypes.c_char_p
        wide = b'USE64BITINT' in (config() or b'')
        index = ctypes.c_int64 if wide else ctypes.c_int32
    routines = {}
    ptr = ctypes.c_void_p
    for p, real in _SCALAR.items():
        for op, args in (('axpby', (index, real, ptr, index, real, ptr,
                                    index)),
                         ('axpy', (index, real, ptr, index, ptr, index))):
            f = getattr(dll, pattern.format(p + op), None)
            if f is None:
                return None
            f.argtypes, f.restype = args, None
            routines[p + op] = f
    return routines


def _checked(routines):
    """``routines`` if they compute a small case as NumPy does, else {}."""
    for dtype in _PREFIX:
        x = numpy.arange(1, 6, dtype=dtype)
        y = numpy.full(5, 2, dtype)
        want = 0.5 * x + 3 * y
        p = _PREFIX[dtype]
        routines[p + 'axpby'](5, 0.5, x.ctypes.data, 1, 3, y.ctypes.data, 1)
        routines[p + 'axpy'](5, -1, x.ctypes.data, 1, y.ctypes.data, 1)
        if not numpy.array_equal(y, want - x):
            return {}
    return routines


def _get(name):
    global _routines
    if _routines is None:  # two threads may both look: the same result
        found = _library_routines()
        _routines = _checked(found) if found else {}
    return _routines.get(name)


def _routine(op, x, y):
    """The routine ``op`` for ``x`` and the written ``y`` when both are 1-D
    contiguous NumPy arrays of one length and one float32/float64 dtype,
    ``y`` writable, and the BLAS has it; else None."""
    p = _PREFIX.get(getattr(x, 'dtype', None))
    if p is None or not all(
            isinstance(b, numpy.ndarray) and b.ndim == 1
            and b.dtype == x.dtype and b.shape == x.shape
            and b.flags.c_contiguous for b in (x, y)) \
            or not y.flags.writeable:
        return None
    return _get(p + op)


def axpby(alpha, x, beta, y):
    """``y = alpha * x + beta * y`` in place; True when done, False (y
    untouched) where the BLAS cannot: see :func:`_routine`."""
    f = _routine('axpby', x, y)
    if f is None:
        return False
    f(y.size, alpha, x.ctypes.data, 1, beta, y.ctypes.data, 1)
    return True


def axpy(alpha, x, y):
    """``y += alpha * x`` in place; True when done, False as
    :func:`axpby`."""
    f = _routine('axpy', x, y)
    if f is None:
        return False
    f(y.size, alpha, x.ctypes.data, 1, y.ctypes.data, 1)
    return True


def available():
    """Whether the direct calls are in use in this process."""
    return _get('saxpby') is not None
