"""What CuPy needs from PyPI besides itself, and the messages naming it.

Since CuPy 14 the ``cupy-cuda12x`` / ``cupy-cuda13x`` wheels hold no CUDA
library: NVRTC (which compiles every kernel) and the CUDA headers come with
CuPy's ``[ctk]`` extra, NCCL with its own wheel. Without them CuPy still
imports; the first kernel launch fails with "Failed to find CUDA headers",
and ``cupy.cuda.nccl.available`` is False. ``minichain.backend`` asks here
what is missing, so that its errors name the package to install. The cupy
module is passed in: only ``backend`` imports it.
"""
import contextlib
import os

# CUDA major version -> the wheels that hold what CuPy loads at run time.
PACKAGES = {
    12: {'nvrtc': 'nvidia-cuda-nvrtc-cu12', 'headers':
         'nvidia-cuda-runtime-cu12', 'nccl': 'nvidia-nccl-cu12',
         'cublas': 'nvidia-cublas-cu12'},
    13: {'nvrtc': 'nvidia-cuda-nvrtc', 'headers': 'nvidia-cuda-runtime',
         'nccl': 'nvidia-nccl-cu13', 'cublas': 'nvidia-cublas'},
}


def cuda_major(cupy):
    """The CUDA major version CuPy was built for (12, 13, ...), or None.

    Read from the installed wheel's name (``cupy-cuda12x``), which needs no
    driver, else from the CUDA runtime CuPy loads.
    """
    from importlib import metadata
    for major in sorted(PACKAGES):
        try:
            metadata.distribution('cupy-cuda{}x'.format(major))
            return major
        except metadata.PackageNotFoundError:
            pass
    try:
        return int(cupy.cuda.runtime.runtimeGetVersion()) // 1000
    except Exception:
        return None


def package(what, major):
    """The wheel that provides ``what`` (``'nvrtc'``, ``'headers'``,
    ``'nccl'`` or ``'cublas'``) for CUDA ``major``, as text for a message."""
    if major in PACKAGES:
        return PACKAGES[major][what]
    return '{} (the one matching your CuPy\'s CUDA version)'.format(
        ' or '.join(p[what] for _, p in sorted(PACKAGES.items())))


def nccl_missing(cupy, error, major=None):
    """Why NCCL cannot be used (``error``: the ImportError, or None when
    CuPy found no library) and which wheel to install."""
    major = cuda_major(cupy) if major is None else major
    why = ('CuPy was built without NCCL ({})'.format(error) if error
           else 'CuPy found no NCCL library (libnccl.so.2)')
    return ('{}; install it: pip install {}, or use the flat communicator'
            .format(why, package('nccl', major)))


def cublas_missing(cupy, error):
    """Why CuPy cannot load cuBLAS (``error``: the ImportError of its cuBLAS
    module, whose pathfinder report runs over many lines), in one line
    naming the wheel."""
    major = cuda_major(cupy)
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return ('CuPy cannot load cuBLAS ({}); install it: pip install {} (the '
            'GPU extra brings it: in a minichain checkout pip install -e '
            '".[cuda{}]")'.format(first, package('cublas', major),
                                  major or 12))


SYSTEM_CUDA = '/usr/local/cuda'   # where CuPy looks last
HEADER = 'cuda_runtime.h'


def cuda_headers(cupy=None):
    """A directory holding the CUDA headers where CuPy >= 14 would find
    them, or None. CuPy looks in more places than the pathfinder's
    ``cudart`` header directory (the runtime wheel, conda, ``CUDA_PATH``):
    also under its CUDA root (``cupy.cuda.get_cuda_path()``, which it
    derives from NVRTC's location), ``CUDA_PATH`` / ``CUDA_HOME`` and
    ``/usr/local/cuda``. A node with a system CUDA and no runtime wheel
    compiles kernels, so it must pass here too."""
    for folder in _header_candidates(cupy):
        if folder and os.path.isfile(os.path.join(folder, HEADER)):
            return folder
    return None


def _header_candidates(cupy):
    with contextlib.suppress(Exception):
        from cuda.pathfinder import find_nvidia_header_directory
        yield find_nvidia_header_directory('cudart')
    roots = []
    with contextlib.suppress(Exception):
        roots.append(cupy.cuda.get_cuda_path())
    roots += [os.environ.get('CUDA_PATH'), os.environ.get('CUDA_HOME'),
              SYSTEM_CUDA]
    for root in roots:
        if root:
            yield os.path.join(root, 'include')


def _cupy_major(cupy):
    try:
        return int(cupy.__version__.split('.')[0])
    except (AttributeError, ValueError):
        return 0


def toolkit_problem(cupy):
    """'' when CuPy can compile kernels (it finds NVRTC and, from CuPy 14
    on, the CUDA headers), else what is missing and how to install it."""
    major = cuda_major(cupy)
    missing = []
    try:
        cupy.cuda.nvrtc.getVersion()
    except Exception as e:
        missing.append('NVRTC ({}: {}; pip install {})'.format(
            type(e).__name__, e, package('nvrtc', major)))
    if _cupy_major(cupy) >= 14 and cuda_headers(cupy) is None:
        missing.append('the CUDA headers (pip install {}, or set CUDA_PATH '
                       'to a CUDA toolkit)'.format(package('headers', major)))
    if not missing:
        return ''
    return ('{} not found; the GPU extra installs both (in a minichain '
            'checkout: pip install -e ".[cuda{}]")'.format(
                ' and '.join(missing), major or 12))
