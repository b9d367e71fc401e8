"""cuDNN kernels for CuPy arrays, through ctypes (``_lib.py``).

CuPy 14 dropped its cuDNN binding; cuDNN itself is the library PyTorch's
GPU convolutions and batch normalization run on. Registered for the
convolution's three products and for batch normalization (training
forward and gradient, inference), float16 and float32, tried before the
CuPy kernels of ``kernels/cuda``. ``config.use_cudnn`` chooses, its
default taken from ``MINICHAIN_CUDNN`` (``kernels/_switch.py``): 'auto'
uses cuDNN when the library loads and was built for CuPy's CUDA major,
'always' makes a cuDNN that cannot be used an error, 'never' declines.

Importing this package never raises for a missing library: the kernels
are registered and decline when it cannot be used. Without a GPU, the
library still loads (its version, descriptors and output shapes:
tests/kernels/test_cudnn.py); only the handle needs a device.
"""
from minichain import backend, kernels
from minichain.kernels import _switch
from minichain.kernels.cudnn import _lib, convolution, normalization

_problem = None   # why cuDNN cannot be used ('' when it can), once asked


def problem():
    """'' when cuDNN can be used, else why (asked once)."""
    global _problem
    if _problem is None:
        try:
            _lib.load()
            _problem = _cuda_mismatch()
        except OSError as e:
            _problem = str(e)
    return _problem


def _cuda_mismatch():
    built = runtime = _lib.version()[1] // 1000
    if backend.gpu_available():
        cupy = backend.get_cupy()
        runtime = int(cupy.cuda.runtime.runtimeGetVersion()) // 1000
    if built == runtime:
        return ''
    return ('{} was built for CUDA {} but CuPy runs CUDA {}: install '
            'nvidia-cudnn-cu{}'.format(_lib.path, built, runtime, runtime))


def describe():
    """One line: the cuDNN in use (version, CUDA, where from), or why
    none is."""
    if problem():
        return 'cuDNN not used: ' + problem()
    v, cuda = _lib.version()
    return 'cuDNN {}.{}.{} for CUDA {}.{} from {}'.format(
        v // 10000, v // 100 % 100, v % 100, cuda // 1000, cuda % 1000 // 10,
        _lib.path)


def enabled():
    """Whether the cuDNN kernels run now, by ``config.use_cudnn``."""
    return _switch.enabled('cudnn', 'cuDNN', problem)


for _module in (convolution, normalization):
    for _type, _kernel in _module.KERNELS.items():
        kernels.register(_type, 'cudnn', _switch.gated(_kernel, enabled))
