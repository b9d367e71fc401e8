"""Host tuning of the CPU path: BLAS threads, minichain's own threads, malloc.

Nothing here runs at ``import minichain``: a notebook or a test suite that
imports the package keeps its allocator and its BLAS as they were. The
training scripts in ``models/`` and the benchmarks in ``bench/`` switch on
what they want (:func:`tune_malloc`); the BLAS thread count comes from
``OPENBLAS_NUM_THREADS`` or :func:`set_blas_threads`.

Threads. minichain's CPU kernels (``kernels/numpy/``: ``_cpu_kernels.py``,
``_im2col.py``, ``_normalization_kernels.py``) share their work out over
threads of their own (``kernels/numpy/_parallel.py``), as many as the BLAS has
when the kernel starts, and keep the BLAS itself on one thread meanwhile
(:func:`cpu_kernel_scope`). Why not let OpenBLAS thread the products: its
idle threads spin for a while after every threaded call, and beside them
the copies that build a convolution's columns ran several times slower
(``bench/README.md`` has the figures). The BLAS libraries are found and
driven through ``threadpoolctl``.
"""
import contextlib
import ctypes
import functools
import os
import sys
import threading

import numpy

__all__ = ['tune_malloc', 'set_blas_threads', 'get_blas_threads',
           'cpu_kernel_scope', 'cpu_kernel', 'cpu_kernel_threads',
           'host_threads', 'set_host_threads']


# -- malloc -------------------------------------------------------------------
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
_MMAP_THRESHOLD_MAX = 32 << 20


def tune_malloc(mmap_threshold=_MMAP_THRESHOLD_MAX, trim_threshold=2 ** 31 - 1):
    """Keep freed large blocks in the process instead of returning them.

    glibc serves blocks above its mmap threshold (128 KiB to 32 MiB,
    adapting) with fresh ``mmap`` pages and unmaps them on free, and trims
    the heap top past its trim threshold; a training step allocates and
    frees the same multi-megabyte activations every iteration, so each one
    page-faults anew. Raising both thresholds lets the heap recycle those
    blocks; the resident peak stays the same, but memory freed after
    training goes back to the OS only at exit. This changes the allocator
    of the whole process, which is why only programs that train call it
    (``models/train_*.py``, ``bench/*.py``); ``import minichain`` does not.

    ``MINICHAIN_MALLOPT=0`` in the environment turns the call into a no-op
    (to compare a run without it). Blocks larger than ``mmap_threshold``
    are still mapped afresh.

    Args:
        mmap_threshold: bytes; at most 32 MiB (glibc's limit).
        trim_threshold: bytes of free heap top kept before trimming.
    Returns:
        True if glibc accepted both settings; False where there is no glibc
        ``mallopt`` (other platforms and C libraries) or the environment
        opted out. Settings above glibc's limits are clamped to them.
    """
    if (os.environ.get('MINICHAIN_MALLOPT', '1') == '0'
            or not sys.platform.startswith('linux')):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return (mallopt(_M_MMAP_THRESHOLD,
                    int(min(mmap_threshold, _MMAP_THRESHOLD_MAX))) == 1
            and mallopt(_M_TRIM_THRESHOLD,
                        int(min(trim_threshold, 2 ** 31 - 1))) == 1)


# -- the BLAS's threads -------------------------------------------------------
_blas = None  # threadpoolctl's controllers of the loaded BLAS libraries


def _blas_libraries(rescan=False):
    """threadpoolctl's controller of each BLAS library loaded in this
    process (NumPy's OpenBLAS among them), looked up once; ``rescan`` looks
    again (a library loaded later, e.g. by SciPy)."""
    global _blas
    if _blas is None or rescan:
        import threadpoolctl
        _blas = tuple(threadpoolctl.ThreadpoolController().select(
            user_api='blas').lib_controllers)
    return _blas


def _check_count(name, n):
    if (isinstance(n, bool) or not isinstance(n, (int, numpy.integer))
            or n < 1):
        raise ValueError('{}: n must be a positive int, got {!r}'
                         .format(name, n))
    return int(n)


def set_blas_threads(n):
    """Set how many threads the BLAS behind NumPy uses for products; this
    is also how many threads of their own minichain's CPU kernels use.

    One rank per core wants ``n = 1`` (``mpiexec -n 2`` on two cores); one
    process owning the machine wants the core count.

    Args:
        n: positive int.
    Returns:
        True if a BLAS library took the setting, False if none was found
        (then set ``OPENBLAS_NUM_THREADS`` before starting Python).
    Raises:
        ValueError: n is not a positive int.
    """
    n = _check_count('set_blas_threads', n)
    libraries = _blas_libraries(rescan=True)
    for lib in libraries:
        lib.set_num_threads(n)
    return bool(libraries)


def get_blas_threads():
    """The BLAS thread count (an int), or None when no BLAS was found."""
    libraries = _blas_libraries()
    if not libraries:
        return None
    return int(libraries[0].get_num_threads())


# -- minichain's own CPU threads ----------------------------------------------
_scope = threading.local()  # .depth, .threads: the kernel scope of a thread


@contextlib.contextmanager
def cpu_kernel_scope():
    """Run a CPU kernel with the BLAS on one thread; yield its thread count.

    The count is what the BLAS had on entry (:func:`set_blas_threads`; its
    default is the core count): the kernel shares its work out over that
    many threads of its own (``kernels/numpy/_parallel.py``), each calling the
    BLAS single-threaded, and the BLAS gets its count back on exit.

    Nested scopes (a kernel calling another) keep the outer count. The BLAS
    setting is process-wide, and threadpoolctl lets one Python thread at a
    time change OpenBLAS's (the first that does, while it lives): kernels on
    other threads run with the BLAS as it is. The results stay right either
    way, only the speed changes.
    """
    if getattr(_scope, 'depth', 0):
        _scope.depth += 1
        try:
            yield _scope.threads
        finally:
            _scope.depth -= 1
        return
    libraries = _blas_libraries()
    n = max(1, int(libraries[0].get_num_threads() or 1)) if libraries else 1
    if n > 1:
        for lib in libraries:
            lib.set_num_threads(1)
    _scope.depth, _scope.threads = 1, n
    try:
        yield n
    finally:
        _scope.depth = 0
        if n > 1:
            for lib in libraries:
                lib.set_num_threads(n)


def cpu_kernel(kernel):
    """Decorate a CPU kernel so that it runs inside :func:`cpu_kernel_scope`
    when its first argument is a NumPy array (CuPy arrays pass straight
    through: the GPU has no use for host threads)."""
    @functools.wraps(kernel)
    def run(*args, **kwargs):
        if not isinstance(args[0], numpy.ndarray):
            return kernel(*args, **kwargs)
        with cpu_kernel_scope():
            return kernel(*args, **kwargs)
    return run


def cpu_kernel_threads():
    """Threads this thread's CPU kernel may use: the count that the
    innermost :func:`cpu_kernel_scope` found, or 1 outside any scope."""
    return _scope.threads if getattr(_scope, 'depth', 0) else 1


_host_threads = None  # 0: follow the kernel (cpu_kernel_threads)


def host_threads():
    """How many threads minichain's CPU kernels may use for elementwise work.

    The count given to :func:`set_host_threads`, else
    ``MINICHAIN_HOST_THREADS`` from the environment, else the current
    kernel's thread count (:func:`cpu_kernel_threads`: the BLAS's count
    inside a kernel, 1 outside any). The passes
    are bound by memory bandwidth, so a second thread helps less than it
    does for the products.
    """
    global _host_threads
    if _host_threads is None:
        env = os.environ.get('MINICHAIN_HOST_THREADS', '')
        _host_threads = int(env) if env.isdigit() and int(env) > 0 else 0
    return _host_threads or cpu_kernel_threads()


def set_host_threads(n):
    """Set :func:`host_threads` (a positive int)."""
    global _host_threads
    _host_threads = _check_count('set_host_threads', n)
