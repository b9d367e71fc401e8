"""The NumPy/CuPy switch: the only module in minichain that imports cupy.

Everything else asks ``xp = backend.get_array_module(x)`` and runs one code
path. CuPy is imported on the first GPU question (``gpu_available``,
``to_gpu``, ``backend.cupy``, ...), never by ``import minichain``: a CuPy
array can exist only once something imported CuPy, so the array checks look
at ``sys.modules`` and import nothing. When CuPy is missing (or no GPU
answers) the package works on NumPy; a call that needs the GPU raises a
``RuntimeError`` that says why.

Host tuning of the CPU path (BLAS threads, malloc) is :mod:`minichain.host`;
its names stay reachable from here, looked up on first use (the ops import
this module, and the speed layer is no import of theirs).
"""
import math
import os
import sys

import numpy

from minichain import _cuda_wheels

_HOST_NAMES = ('cpu_kernel_scope', 'cpu_kernel_threads', 'get_blas_threads',
               'host_threads', 'set_blas_threads', 'set_host_threads',
               'tune_malloc')


def _import_cupy():
    """Import CuPy once; afterwards ``cupy`` is the module or None, and
    ``_cupy_import_error`` says why it is None."""
    global cupy, _cupy_import_error
    try:
        import cupy
        _cupy_import_error = None
    except Exception as e:  # ImportError, or a broken CUDA install raising
        cupy, _cupy_import_error = None, e


def __getattr__(name):
    # ``backend.cupy`` (and ``ndarray``) before the first GPU question.
    if name in ('cupy', '_cupy_import_error'):
        _import_cupy()
        return globals()[name]
    if name in _HOST_NAMES:  # backend's names for minichain.host's
        from minichain import host
        return getattr(host, name)
    if name == 'ndarray':
        cp = _cupy()
        return (numpy.ndarray,) if cp is None else (numpy.ndarray, cp.ndarray)
    raise AttributeError('module {!r} has no attribute {!r}'.format(
        __name__, name))


def _cupy():
    """The cupy module, or None; imports it on the first call."""
    if 'cupy' not in globals():
        _import_cupy()
    return cupy


def _cupy_if_imported():
    """CuPy if some code imported it already, else None (imports nothing)."""
    if 'cupy' in globals():
        return cupy
    return _cupy() if 'cupy' in sys.modules else None


# CUDA runtime error codes that mean "no GPU here" rather than a failure.
_NO_DEVICE = 100            # cudaErrorNoDevice
_INSUFFICIENT_DRIVER = 35   # cudaErrorInsufficientDriver (also: no driver)
_devices = (None, None)    # (cupy module, (count, why, absent))


def gpu_available():
    """True only when CuPy imports, a CUDA device answers and CuPy loads
    cuBLAS (the matrix products); never raises.

    Where no device answers, :func:`gpu_problem` says why.
    """
    return _cupy() is not None and _query_devices()[0] > 0


def gpu_problem():
    """``(absent, why)``: ``(False, '')`` when a CUDA device answers;
    ``(True, why)`` when there is none (no CuPy, no driver, no device
    visible); ``(False, why)`` when CUDA itself failed, e.g. a driver older
    than CuPy's CUDA runtime, or cuBLAS is missing: a GPU machine that
    needs fixing."""
    if _cupy() is None:
        return True, 'CuPy is not installed or failed to import ({})'.format(
            _cupy_import_error)
    _, why, absent = _query_devices()
    return absent, why


def _query_devices():
    """``(count, why, absent)`` from ``cudaGetDeviceCount``, once per CuPy.

    Not ``cupy.cuda.is_available()``: it turns every CUDA error into a
    cached False, so that an old driver read as "no GPU".
    """
    global _devices
    cp = _cupy()
    if _devices[0] is not cp:
        _devices = (cp, _ask_device_count(cp))
    return _devices[1]


def _ask_device_count(cp):
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:
        status = getattr(e, 'status', None)
        if status == _NO_DEVICE:
            return 0, _no_device(), True
        if status == _INSUFFICIENT_DRIVER and _driver_version(cp) == 0:
            return 0, ('no NVIDIA driver is installed (libcuda not found: '
                       'no GPU here, or the driver is missing)'), True
        why = 'CUDA failed to count the devices: {}: {}'.format(
            type(e).__name__, e)
        if status == _INSUFFICIENT_DRIVER:
            why += _driver_advice(cp)
        return 0, why, False
    if count == 0:
        return 0, _no_device(), True
    why = _cublas_problem(cp)  # a GPU machine to fix
    return (0, why, False) if why else (count, '', False)


def _cublas_problem(cp):
    """'' when CuPy's cuBLAS module loads, else why. CuPy loads libcublas
    (and libcublasLt, which it needs) at the first matrix product only: a
    node without them saw its device, then failed deep inside a matmul."""
    try:
        from cupy_backends.cuda.libs import cublas  # noqa: F401 (loads it)
    except ImportError as e:
        return _cuda_wheels.cublas_missing(cp, e)
    return ''


def _no_device():
    return ('no CUDA device is visible (CUDA_VISIBLE_DEVICES={})'.format(
        os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')))


def _driver_version(cp):
    try:
        return int(cp.cuda.runtime.driverGetVersion())
    except Exception:
        return -1


def _cuda_version_text(version):
    return '{}.{}'.format(version // 1000, version % 1000 // 10)


def _driver_advice(cp):
    try:
        runtime = int(cp.cuda.runtime.runtimeGetVersion())
    except Exception:
        return ''
    driver = _driver_version(cp)
    if driver <= 0:
        return ''
    return ('; the NVIDIA driver supports CUDA {} and CuPy runs CUDA {}: '
            'update the driver, or install CuPy for CUDA {} (in a minichain '
            'checkout: pip install -e ".[cuda{}]")'.format(
                _cuda_version_text(driver), _cuda_version_text(runtime),
                driver // 1000, driver // 1000))


def check_cuda_available():
    """Raise a clear ``RuntimeError`` unless a GPU can be used.

    The message names what is missing: CuPy itself, a CUDA device (or the
    CUDA error that hid it), or the CUDA pieces that CuPy 14 no longer
    ships in its wheel (NVRTC and the CUDA headers, needed to compile every
    kernel) with the pip package that provides each.
    """
    if _cupy() is None:
        raise RuntimeError(
            'minichain: CuPy is not installed or failed to import ({}); '
            'install CuPy for your CUDA version (pip install '
            '"cupy-cuda12x[ctk]" nvidia-nccl-cu12, or -cuda13x / -cu13; in '
            'a minichain checkout: pip install -e ".[cuda12]" or '
            '".[cuda13]")'.format(_cupy_import_error))
    if not gpu_available():
        absent, why = gpu_problem()
        raise RuntimeError('minichain: CuPy is installed but {}'.format(
            'no GPU can be used: ' + why if absent else why))
    problem = _toolkit_problem()
    if problem:
        raise RuntimeError('minichain: CuPy cannot compile kernels: ' + problem)


_toolkit_checked = None


def _toolkit_problem():
    """'' when CuPy finds NVRTC and the CUDA headers, else what is missing
    (checked once; see :func:`minichain._cuda_wheels.toolkit_problem`)."""
    global _toolkit_checked
    if _toolkit_checked is None:
        _toolkit_checked = _cuda_wheels.toolkit_problem(cupy)
    return _toolkit_checked


def is_array(x):
    """True for a NumPy or CuPy ndarray."""
    if isinstance(x, numpy.ndarray):
        return True
    cp = _cupy_if_imported()
    return cp is not None and isinstance(x, cp.ndarray)


def is_float(dtype):
    """Whether ``dtype`` is a floating-point type: NumPy's (kind 'f') or
    ``ml_dtypes.bfloat16``, which NumPy lists as kind 'V' (a type it does
    not know) and which mixed16 puts activations in on the CPU."""
    dtype = numpy.dtype(dtype)
    return dtype.kind == 'f' or dtype.name == 'bfloat16'


def mixed16_dtype(xp):
    """The 16-bit float of mixed16 activations on ``xp``'s device: float16
    on the GPU (tensor cores), ``ml_dtypes.bfloat16`` on the CPU, where
    oneDNN has bfloat16 kernels and float16 would be emulated (and where
    bfloat16's 8-bit exponent, float32's, needs no loss scaling)."""
    if xp is not numpy:
        return numpy.dtype(numpy.float16)
    try:
        import ml_dtypes
    except ImportError as e:
        raise RuntimeError('config.dtype mixed16 on the CPU keeps activations '
                           'in bfloat16, which needs ml_dtypes: pip install '
                           'ml_dtypes') from e
    return numpy.dtype(ml_dtypes.bfloat16)


def get_array_module(*args):
    """Return ``cupy`` if any argument lives on the GPU, else ``numpy``.

    Variables are looked through to their arrays.
    """
    cp = _cupy_if_imported()
    if cp is not None:
        for x in args:
            x = getattr(x, 'array', x)
            if isinstance(x, cp.ndarray):
                return cp
    return numpy


def to_cpu(x):
    """Return ``x`` as a NumPy array (a copy only when it lives on the GPU).

    ``None`` passes through; lists and tuples are converted element-wise.
    """
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(e) for e in x)
    cp = _cupy_if_imported()
    if cp is not None and isinstance(x, cp.ndarray):
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
    cp = _cupy_if_imported()
    if cp is not None and isinstance(x, cp.ndarray):
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


def get_cublas():
    """CuPy's cuBLAS module (``cupy.cuda.cublas``, which CuPy 14 keeps in
    ``cupy_backends``), for the kernels that call cuBLAS themselves."""
    check_cuda_available()
    from cupy_backends.cuda.libs import cublas
    return cublas


def set_tf32(enabled):
    """Let float32 matrix products on the GPU (cuBLAS through CuPy: the
    linear layers and the GPU convolutions) run on TF32 tensor cores, or
    not (the default, as PyTorch's matmul default): TF32 rounds the factors
    to a 10-bit mantissa (sums stay float32) for several times the float32
    rate on Ampere and later. CuPy's own switch is the ``CUPY_TF32``
    variable; it reaches only CuPy's 2-D products (``dot``), while its
    batched ``matmul`` (the GPU convolutions) asks cuBLAS for float32
    compute, which the cuBLAS handle's math mode turns into TF32. So both
    are set: the compute type for the process, the math mode for the
    current device's handle in the calling thread (call it after choosing
    the device)."""
    cp = get_cupy()
    cp._core.set_compute_type(
        numpy.float32, cp._core._routines_linalg.COMPUTE_TYPE_TF32 if enabled
        else cp._core._routines_linalg.COMPUTE_TYPE_DEFAULT)
    from cupy_backends.cuda.libs import cublas  # cupy.cuda.cublas, loaded
    cublas.setMathMode(cp.cuda.device.get_cublas_handle(),
                       CUBLAS_TF32_TENSOR_OP_MATH if enabled
                       else cublas.CUBLAS_DEFAULT_MATH)


# cublasMath_t's value from cublas_api.h: CuPy (14.2) binds only
# CUBLAS_DEFAULT_MATH and CUBLAS_TENSOR_OP_MATH, not this one.
CUBLAS_TF32_TENSOR_OP_MATH = 3


def tf32_enabled():
    """Whether float32 products on the GPU use TF32 (False without one)."""
    cp = _cupy_if_imported()
    if cp is None or not gpu_available():
        return False
    return (cp._core.get_compute_type(numpy.float32)
            == cp._core._routines_linalg.COMPUTE_TYPE_TF32)


def get_nccl():
    """``cupy.cuda.nccl``, or a ``RuntimeError`` saying what is missing.

    CuPy 14 imports ``cupy.cuda.nccl`` even without the NCCL library and
    only sets ``available = False``; the message then names the wheel.
    """
    check_cuda_available()
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        raise RuntimeError(_cuda_wheels.nccl_missing(cupy, e)) from e
    if not getattr(nccl, 'available', True):
        raise RuntimeError(_cuda_wheels.nccl_missing(cupy, None))
    return nccl


def _total(a):
    return a.sum(dtype=numpy.float32 if a.dtype.itemsize < 4 else None)


def all_finite(arrays):
    """Whether every element of ``arrays`` (one device) is finite.

    A sum is finite iff every term is (short of an overflow, confirmed
    elementwise), so the good path costs one reduction per array and, on
    the GPU, one read of one value."""
    if not arrays:
        return True
    xp = get_array_module(arrays[0])
    if xp is numpy:
        # inf + -inf is NaN, as it should be here: no warning for it
        with numpy.errstate(invalid='ignore', over='ignore'):
            fast = math.isfinite(sum(float(_total(a)) for a in arrays))
    else:
        fast = bool(finite_flag(arrays))
    return fast or all(bool(xp.isfinite(a).all()) for a in arrays)


def finite_flag(arrays):
    """A 0-d boolean array on the arrays' device (no host wait): whether
    each array's sum is finite (False too when a sum only overflowed)."""
    xp = get_array_module(arrays[0])
    return xp.isfinite(xp.stack([_total(a) for a in arrays])).all()
