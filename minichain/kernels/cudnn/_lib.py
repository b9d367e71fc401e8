"""A small ctypes binding of cuDNN 9's legacy C API (``libcudnn.so.9``).

cuDNN is the library PyTorch's GPU convolutions and batch normalization
run on. Its wheels (``nvidia-cudnn-cu13``: the ``cudnn`` extra;
``nvidia-cudnn-cu12``) hold the library and its headers under
``site-packages/nvidia/cudnn``; PyTorch's CUDA wheels depend on the same
ones, so a machine with PyTorch has it. :func:`load` looks for it there
(every ``sys.path`` entry), in PyTorch's own ``torch/lib``, then where
the system loader looks. The enum values and the perf-result struct are
copied from cuDNN 9.28's headers (``cudnn_graph.h``, ``cudnn_ops.h``,
``cudnn_cnn.h``).

What a student needs of cuDNN to read the kernels:

- a *handle* per device, told the CuPy stream to run on before each call;
- *descriptors*: a tensor's shape, strides and dtype (4-d, NCHW), a
  filter's (O, C/G, kh, kw), a convolution's padding, stride, dilation,
  groups, accumulation dtype and math (tensor cores or not);
- for each convolution, an *algorithm* among several, ranked by cuDNN's
  heuristics (no timing run), with the scratch memory it needs.

Descriptors are made once per shape and kept; the arrays are passed as
device pointers (``array.data.ptr``).
"""
import ctypes
import glob
import os
import sys

import numpy

SONAME = 'libcudnn.so.9'
ENV = 'MINICHAIN_CUDNN_LIBRARY'   # a path to libcudnn.so.9, tried alone

# -- enum values (cuDNN 9.28 headers) -----------------------------------------
SUCCESS = 0                          # cudnnStatus_t
DATA = {numpy.dtype(numpy.float32): 0, numpy.dtype(numpy.float16): 2}
FLOAT = 0                            # cudnnDataType_t CUDNN_DATA_FLOAT
NCHW = 0                             # cudnnTensorFormat_t
CROSS_CORRELATION = 1                # cudnnConvolutionMode_t
DEFAULT_MATH, TENSOR_OP_MATH, FMA_MATH = 0, 1, 3   # cudnnMathType_t
DETERMINISTIC = 1                    # cudnnDeterminism_t
BATCHNORM_SPATIAL = 1                # cudnnBatchNormMode_t
BN_MIN_EPSILON = 1e-5                # CUDNN_BN_MIN_EPSILON


class AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (one layout)."""
    _fields_ = [('algo', ctypes.c_int), ('status', ctypes.c_int),
                ('time', ctypes.c_float), ('memory', ctypes.c_size_t),
                ('determinism', ctypes.c_int), ('mathType', ctypes.c_int),
                ('reserved', ctypes.c_int * 3)]


_P, _I, _D = ctypes.c_void_p, ctypes.c_int, ctypes.c_double
_PP, _IP = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int)
_PERF = ctypes.POINTER(AlgoPerf)
# the argument types of the three products' heuristics and runs
_ALGORITHM = (_P,) * 5 + (_I, _IP, _PERF)
_PRODUCT = (_P,) * 7 + (_I, _P, ctypes.c_size_t) + (_P,) * 3
# name: argument types (every call returns a cudnnStatus_t)
CALLS = {
    'cudnnCreate': (_PP,),
    'cudnnSetStream': (_P, _P),
    'cudnnCreateTensorDescriptor': (_PP,),
    'cudnnSetTensor4dDescriptorEx': (_P, _I) + (_I,) * 8,
    'cudnnCreateFilterDescriptor': (_PP,),
    'cudnnSetFilter4dDescriptor': (_P, _I, _I, _I, _I, _I, _I),
    'cudnnCreateConvolutionDescriptor': (_PP,),
    'cudnnSetConvolution2dDescriptor': (_P,) + (_I,) * 8,
    'cudnnSetConvolutionGroupCount': (_P, _I),
    'cudnnSetConvolutionMathType': (_P, _I),
    'cudnnGetConvolution2dForwardOutputDim': (_P, _P, _P) + (_IP,) * 4,
    'cudnnGetConvolutionForwardAlgorithm_v7': _ALGORITHM,
    'cudnnGetConvolutionBackwardDataAlgorithm_v7': _ALGORITHM,
    'cudnnGetConvolutionBackwardFilterAlgorithm_v7': _ALGORITHM,
    'cudnnConvolutionForward': _PRODUCT,
    'cudnnConvolutionBackwardData': _PRODUCT,
    'cudnnConvolutionBackwardFilter': _PRODUCT,
    'cudnnDeriveBNTensorDescriptor': (_P, _P, _I),
    'cudnnBatchNormalizationForwardTraining': (_P, _I) + (_P,) * 9 + (
        _D, _P, _P, _D, _P, _P),
    'cudnnBatchNormalizationForwardInference': (_P, _I) + (_P,) * 11 + (
        _D,),
    'cudnnBatchNormalizationBackward': (_P, _I) + (_P,) * 14 + (
        _D, _P, _P),
}

lib = None        # the loaded library, once load() succeeded
path = None       # where it was found, and from which package


def candidates():
    """``(path, where from)`` to try, in order."""
    configured = os.environ.get(ENV, '').strip()
    if configured:
        yield configured, ENV
        return
    for entry in sys.path:
        entry = os.path.abspath(entry or '.')
        wheel = os.path.join(entry, 'nvidia', 'cudnn', 'lib', SONAME)
        if os.path.isfile(wheel):
            yield wheel, _owner(entry)
        bundled = os.path.join(entry, 'torch', 'lib', SONAME)
        if os.path.isfile(bundled):
            yield bundled, "PyTorch's own copy"
    yield SONAME, 'the system loader'


def _owner(site):
    """Which wheel put cuDNN in ``site``, and whether PyTorch is there."""
    wheels = sorted(os.path.basename(p).split('.dist-info')[0]
                    for p in glob.glob(os.path.join(
                        site, 'nvidia_cudnn_cu*.dist-info')))
    torch = glob.glob(os.path.join(site, 'torch-*.dist-info'))
    return '{}{}'.format(', '.join(wheels) or 'a cuDNN wheel',
                         " (PyTorch's dependency)" if torch else '')


def load():
    """Load libcudnn once and declare its calls. Raises ``OSError`` with
    every place tried and how to install it."""
    global lib, path
    if lib is not None:
        return lib
    tried = []
    for where, owner in candidates():
        try:
            found = ctypes.CDLL(where)
        except OSError as e:
            tried.append('{} ({})'.format(where,
                                          str(e).split(':')[-1].strip()))
            continue
        found.cudnnGetVersion.restype = ctypes.c_size_t
        found.cudnnGetCudartVersion.restype = ctypes.c_size_t
        found.cudnnGetErrorString.restype = ctypes.c_char_p
        found.cudnnGetErrorString.argtypes = (ctypes.c_int,)
        for name, argtypes in CALLS.items():
            fn = getattr(found, name)
            fn.restype, fn.argtypes = ctypes.c_int, argtypes
        lib, path = found, '{} ({})'.format(where, owner)
        return lib
    raise OSError('cuDNN 9 was not found: tried {}; install it: pip install '
                  'nvidia-cudnn-cu13 (CUDA 13) or nvidia-cudnn-cu12 (in a '
                  'minichain checkout: pip install -e ".[cudnn]"), or set {} '
                  'to libcudnn.so.9'.format('; '.join(tried), ENV))


def version():
    """``(cuDNN version, CUDA runtime version it was built for)`` as
    integers (90281, 13000)."""
    return int(lib.cudnnGetVersion()), int(lib.cudnnGetCudartVersion())


def check(status, call, where=''):
    """Raise a RuntimeError naming the call, cuDNN's reason and ``where``
    (the shapes) unless ``status`` is success."""
    if status != SUCCESS:
        raise RuntimeError('cuDNN: {} failed with {} ({}){}'.format(
            call, status, lib.cudnnGetErrorString(status).decode(),
            ': ' + where if where else ''))


def call(name, *args, where=''):
    check(getattr(lib, name)(*args), name, where)


# -- descriptors, made once per shape --------------------------------------
_descriptors = {}


def _create(kind, key, setter, *args):
    d = _descriptors.get((kind, key))
    if d is None:
        d = ctypes.c_void_p()
        call('cudnnCreate{}Descriptor'.format(kind), ctypes.byref(d))
        call(setter, d, *args, where='{} {}'.format(kind.lower(), key))
        _descriptors[kind, key] = d
    return d


def tensor_desc(shape, dtype, strides=None):
    """A 4-d tensor descriptor; ``strides`` in elements (default: C order).
    A 2-d (N, C) shape is taken as (N, C, 1, 1)."""
    shape = tuple(shape) + (1,) * (4 - len(shape))
    if strides is None:
        strides = tuple(int(numpy.prod(shape[i + 1:])) for i in range(4))
    strides = tuple(strides) + (1,) * (4 - len(strides))
    return _create('Tensor', (shape, strides, DATA[numpy.dtype(dtype)]),
                   'cudnnSetTensor4dDescriptorEx', DATA[numpy.dtype(dtype)],
                   *(shape + strides))


def filter_desc(shape, dtype):
    """A filter descriptor (O, C/G, kh, kw), C order."""
    code = DATA[numpy.dtype(dtype)]
    return _create('Filter', (tuple(shape), code),
                   'cudnnSetFilter4dDescriptor', code, NCHW, *shape)


def conv_desc(pad, stride, dilate, groups, math):
    """A cross-correlation (a deep-learning convolution) accumulated in
    float32, with ``groups`` and the math type (tensor cores or FMA)."""
    key = (tuple(pad), tuple(stride), tuple(dilate), groups, math)
    d = _descriptors.get(('Convolution', key))
    if d is None:
        d = _create('Convolution', key, 'cudnnSetConvolution2dDescriptor',
                    *(tuple(pad) + tuple(stride) + tuple(dilate)),
                    CROSS_CORRELATION, FLOAT)
        call('cudnnSetConvolutionGroupCount', d, groups)
        call('cudnnSetConvolutionMathType', d, math)
    return d


def forward_output_dim(conv, x, w):
    """cuDNN's output shape of a convolution (no device needed)."""
    dims = [ctypes.c_int() for _ in range(4)]
    call('cudnnGetConvolution2dForwardOutputDim', conv, x, w,
         *map(ctypes.byref, dims))
    return tuple(d.value for d in dims)


def bn_desc(x_desc):
    """The per-channel descriptor of spatial batch normalization for x."""
    return _create('Tensor', ('bn', x_desc.value),
                   'cudnnDeriveBNTensorDescriptor', x_desc, BATCHNORM_SPATIAL)


# -- handles ---------------------------------------------------------------
_handles = {}


def handle(device_id, stream_ptr):
    """The device's handle, set to run on the stream ``stream_ptr`` (call
    it, and cuDNN, with ``device_id`` the current device)."""
    h = _handles.get(device_id)
    if h is None:
        h = ctypes.c_void_p()
        call('cudnnCreate', ctypes.byref(h))
        _handles[device_id] = h
    call('cudnnSetStream', h, ctypes.c_void_p(stream_ptr))
    return h
