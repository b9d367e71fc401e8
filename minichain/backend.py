"""The NumPy/CuPy switch: the only module in minichain that imports cupy.

Everything else asks ``xp = backend.get_array_module(x)`` and runs one code
path. The module also holds the host-side tuning of the CPU path: glibc's
malloc thresholds (set at import, see :func:`tune_malloc`), the number of
BLAS threads (:func:`set_blas_threads`), which is also how many threads of
their own minichain's CPU ops use, and the scope that keeps the BLAS on one
thread inside an op (:func:`cpu_kernel_scope`).
When CuPy is missing (or no GPU answers) the package still imports and works on
NumPy; a call that needs the GPU raises a ``RuntimeError`` that says why.
"""
import contextlib
import ctypes
import os
import sys
import threading

import numpy

from minichain import _cuda_wheels

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
    """Raise a clear ``RuntimeError`` unless a GPU can be used.

    The message names what is missing: CuPy itself, a CUDA device, or the
    CUDA pieces that CuPy 14 no longer ships in its wheel (NVRTC and the
    CUDA headers, needed to compile every kernel) with the pip package
    that provides each.
    """
    if cupy is None:
        raise RuntimeError(
            'minichain: CuPy is not installed or failed to import ({}); '
            'install the GPU extra for your CUDA version: pip install '
            '"minichain[cuda12]" or "minichain[cuda13]"'.format(
                _cupy_import_error))
    if not gpu_available():
        raise RuntimeError(
            'minichain: CuPy is installed but no CUDA device is available '
            '(no driver, or CUDA_VISIBLE_DEVICES hides every GPU)')
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


# -- host tuning --------------------------------------------------------------
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
_MMAP_THRESHOLD_MAX = 32 << 20
_malloc_tuned = False


def tune_malloc(mmap_threshold=_MMAP_THRESHOLD_MAX, trim_threshold=2 ** 31 - 1):
    """Keep freed large blocks in the process instead of returning them.

    glibc serves blocks above its mmap threshold (128 KiB to 32 MiB,
    adapting) with fresh ``mmap`` pages and unmaps them on free, and trims
    the heap top past its trim threshold; a training step allocates and
    frees the same multi-megabyte activations every iteration, so each one
    page-faults anew (on a ResNet-50 step at batch 8 / 224: ~33k faults and
    ~7% of the step in system time). Raising both thresholds lets the heap
    recycle those blocks; the resident peak stays the same, but memory freed
    after training is not given back to the OS until exit.

    Called once at import on Linux with glibc unless the environment sets
    ``MINICHAIN_MALLOPT=0``. Blocks larger than ``mmap_threshold`` are still
    mapped afresh.

    Args:
        mmap_threshold: bytes; at most 32 MiB (glibc's limit).
        trim_threshold: bytes of free heap top kept before trimming.
    Returns:
        True if glibc accepted both settings, False where there is no glibc
        ``mallopt`` (other platforms and C libraries).
        Settings above glibc's limits are clamped to them.
    """
    global _malloc_tuned
    if not sys.platform.startswith('linux'):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = (mallopt(_M_MMAP_THRESHOLD, int(min(mmap_threshold,
                                             _MMAP_THRESHOLD_MAX))) == 1
          and mallopt(_M_TRIM_THRESHOLD,
                      int(min(trim_threshold, 2 ** 31 - 1))) == 1)
    _malloc_tuned = _malloc_tuned or ok
    return ok


if os.environ.get('MINICHAIN_MALLOPT', '1') != '0':
    tune_malloc()

_BLAS_SETTERS = ('openblas_set_num_threads', 'openblas_set_num_threads64_',
                 'scipy_openblas_set_num_threads64_',
                 'scipy_openblas_set_num_threads', 'MKL_Set_Num_Threads')
_BLAS_GETTERS = ('openblas_get_num_threads', 'openblas_get_num_threads64_',
                 'scipy_openblas_get_num_threads64_',
                 'scipy_openblas_get_num_threads', 'MKL_Get_Max_Threads')


def _blas_libraries():
    """ctypes handles of the BLAS libraries loaded in this process (Linux:
    from /proc/self/maps; NumPy's bundled OpenBLAS is among them once numpy
    is imported)."""
    paths = []
    try:
        with open('/proc/self/maps') as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                name = os.path.basename(path).lower()
                if (('openblas' in name or name.startswith('libmkl_rt'))
                        and path not in paths):
                    paths.append(path)
    except OSError:
        return []
    libs = []
    for path in paths:
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:
            pass
    return libs


def _blas_functions(names):
    found = []
    for lib in _blas_libraries():
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                found.append(fn)
                break
    return found


def set_blas_threads(n):
    """Set how many threads the BLAS behind NumPy uses for products.

    One rank per core wants ``n = 1`` (``mpiexec -n 2`` on two cores);
    one process owning the machine wants the core count. Uses
    ``threadpoolctl`` when it is installed, else the OpenBLAS (or MKL)
    entry point found in the loaded libraries through ctypes.

    Args:
        n: positive int.
    Returns:
        True if a BLAS library took the setting, False if none was found
        (then set ``OPENBLAS_NUM_THREADS`` before starting Python).
    Raises:
        ValueError: n is not a positive int.
    """
    if (isinstance(n, bool) or not isinstance(n, (int, numpy.integer))
            or n < 1):
        raise ValueError('set_blas_threads: n must be a positive int, got '
                         '{!r}'.format(n))
    n = int(n)
    setters = _blas_functions(_BLAS_SETTERS)
    for fn in setters:
        fn.argtypes = (ctypes.c_int,)
        fn.restype = None
        fn(n)
    if setters:
        return True
    try:
        import threadpoolctl
    except ImportError:
        return False
    threadpoolctl.threadpool_limits(n, user_api='blas')
    return any(info.get('user_api') == 'blas'
               for info in threadpoolctl.threadpool_info())


def get_blas_threads():
    """The BLAS thread count (an int), or None when no BLAS was found."""
    getters = _blas_functions(_BLAS_GETTERS)
    if not getters:
        return None
    getters[0].argtypes = ()
    getters[0].restype = ctypes.c_int
    return int(getters[0]())


# -- minichain's own CPU threads ----------------------------------------------
_blas_knobs = None
_scope = threading.local()


def _blas_knob():
    """(getter, setters) of the loaded BLAS, looked up once: a getter
    returning the thread count (or None) and a setter per BLAS library."""
    global _blas_knobs
    if _blas_knobs is None:
        getters = _blas_functions(_BLAS_GETTERS)
        setters = _blas_functions(_BLAS_SETTERS)
        for fn in getters:
            fn.argtypes, fn.restype = (), ctypes.c_int
        for fn in setters:
            fn.argtypes, fn.restype = (ctypes.c_int,), None
        _blas_knobs = (getters[0] if getters else None, tuple(setters))
    return _blas_knobs


@contextlib.contextmanager
def cpu_kernel_scope():
    """Run a CPU op with the BLAS on one thread; yield the op's thread count.

    The count is what the BLAS had on entry (``set_blas_threads``; its
    default is the core count): minichain's CPU kernels share their work
    out over that many threads of their own (``functions/_parallel.py``),
    each calling the BLAS single-threaded, and the BLAS gets its count back
    on exit. Why not let OpenBLAS thread the products: its idle threads
    spin for about 0.1 s after every threaded call, so between the products
    of a training step one core was always busy spinning. The copies that
    build convolution columns then ran on one core, at times 4x slower
    than usual, and a ResNet-50 step switched between fast and slow modes
    (``bench/README.md``, fourth session).

    Nested scopes (an op whose forward applies another op) keep the outer
    count. The BLAS setting is process-wide, so two Python threads running
    ops at once may see each other's setting: the results stay right, only
    the speed changes.
    """
    if getattr(_scope, 'depth', 0):
        _scope.depth += 1
        try:
            yield _scope.threads
        finally:
            _scope.depth -= 1
        return
    getter, setters = _blas_knob()
    n = max(1, int(getter())) if getter is not None else 1
    if n > 1:
        for fn in setters:
            fn(1)
    _scope.depth, _scope.threads = 1, n
    try:
        yield n
    finally:
        _scope.depth = 0
        if n > 1:
            for fn in setters:
                fn(n)


def cpu_kernel_threads():
    """Threads this thread's CPU op may use: the count that the innermost
    :func:`cpu_kernel_scope` found, or 1 outside any scope."""
    return _scope.threads if getattr(_scope, 'depth', 0) else 1


_host_threads = None  # 0: follow the op (cpu_kernel_threads)


def host_threads():
    """How many threads minichain's CPU kernels may use for elementwise work.

    The count given to :func:`set_host_threads`, else
    ``MINICHAIN_HOST_THREADS`` from the environment, else the current op's
    thread count (:func:`cpu_kernel_threads`: the BLAS's count inside an
    op, 1 outside). Splitting the passes did not pay while OpenBLAS's
    threads spun beside them (third session: 5-10% slower at batch 8 /
    224); with the products on minichain's own threads it does, a little
    (fourth session: 2-3% faster steps, taking turns step by step). The
    passes are bound by memory bandwidth: 23 GB/s from one thread, 31 from
    two here.
    """
    global _host_threads
    if _host_threads is None:
        env = os.environ.get('MINICHAIN_HOST_THREADS', '')
        _host_threads = int(env) if env.isdigit() and int(env) > 0 else 0
    return _host_threads or cpu_kernel_threads()


def set_host_threads(n):
    """Set :func:`host_threads` (a positive int)."""
    global _host_threads
    if (isinstance(n, bool) or not isinstance(n, (int, numpy.integer))
            or n < 1):
        raise ValueError('set_host_threads: n must be a positive int, got '
                         '{!r}'.format(n))
    _host_threads = int(n)
