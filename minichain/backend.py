"""The NumPy/CuPy switch: the only module in minichain that imports cupy.

Everything else asks ``xp = backend.get_array_module(x)`` and runs one code
path.
When CuPy is missing (or no GPU answers) the package still imports and works on
NumPy; a call that needs the GPU raises a ``RuntimeError`` that says why.
"""
import numpy

try:
    import cupy
    _cupy_import_error = None
except Exception as e:  # ImportError, or a broken CUDA install raising
    cupy = None
    _cupy_import_error = e

if cupy is not None:
    ndarray = (numpy.ndarray, cupy.ndarray)
else:
    ndarray = (numpy.ndarray,)


def gpu_available():
    """True only when CuPy imports AND a CUDA device answers.

    ``cupy.cuda.is_available()`` returns False cleanly on a machine without a
    driver, so this never raises.
    """
    if cupy is None:
        return False
    try:
        return bool(cupy.cuda.is_available())
    except Exception:
        return False


def check_cuda_available():
    """Raise a clear ``RuntimeError`` unless a GPU can be used."""
    if cupy is None:
        raise RuntimeError(
            'minichain: CuPy is not installed or failed to import ({}); '
            'install the GPU extra: pip install "minichain[gpu]"'.format(
                _cupy_import_error))
    if not gpu_available():
        raise RuntimeError(
            'minichain: CuPy is installed but no CUDA device is available '
            '(no driver, or CUDA_VISIBLE_DEVICES hides every GPU)')


def is_array(x):
    """True for a NumPy or CuPy ndarray."""
    return isinstance(x, ndarray)


def get_array_module(*args):
    """Return ``cupy`` if any argument lives on the GPU, else ``numpy``.

    Variables are looked through to their arrays.
    """
    if cupy is not None:
        for x in args:
            x = getattr(x, 'array', x)
            if isinstance(x, cupy.ndarray):
                return cupy
    return numpy


def to_cpu(x):
    """Return ``x`` as a NumPy array (a copy only when it lives on the GPU).

    ``None`` passes through; lists and tuples are converted element-wise.
    """
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(e) for e in x)
    if cupy is not None and isinstance(x, cupy.ndarray):
        return x.get()
    return numpy.asarray(x)


def to_gpu(x, device=None):
    """Return ``x`` as a CuPy array on ``device`` (an int id or None = current).

    An array already there is returned as is; ``cupy.asarray`` inside the
    device's context copies one from the host or from another GPU.

    Raises:
        RuntimeError: CuPy is missing or no GPU is available (says which).
    """
    check_cuda_available()
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return type(x)(to_gpu(e, device) for e in x)
    if device is None:
        return cupy.asarray(x)
    with cupy.cuda.Device(device):
        return cupy.asarray(x)


def get_device_id(x):
    """The CUDA device id of a CuPy array, or -1 for anything on the host."""
    if cupy is not None and isinstance(x, cupy.ndarray):
        return x.device.id
    return -1


def cuda_device(device_id):
    """A context manager that makes ``device_id`` current (CuPy only)."""
    check_cuda_available()
    return cupy.cuda.Device(device_id)


def get_cupy():
    """The cupy module itself, for the few places that write CUDA kernels."""
    check_cuda_available()
    return cupy


def get_nccl():
    """``cupy.cuda.nccl``, or a ``RuntimeError`` saying what is missing."""
    check_cuda_available()
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        raise RuntimeError('CuPy was built without NCCL ({}); install a CuPy '
                           'wheel with NCCL or use the flat communicator'
                           .format(e)) from e
    if not getattr(nccl, 'available', True):
        raise RuntimeError('NCCL is not available in this CuPy build')
    return nccl
