"""The convolution's three products on cuDNN: forward, data gradient (the
deconvolution) and filter gradient.

Each kernel takes CuPy float16 or float32 arrays in NCHW (copied to C
order when they are not) and declines ``cover_all`` (whose output size
cuDNN does not compute) and any shape whose output cuDNN would size
otherwise. Sums are float32 (float16 data on tensor cores); float32 data
stays off TF32 unless :func:`minichain.backend.set_tf32` turned it on for
the matrix products too. The algorithm is the first deterministic one of
cuDNN's heuristic ranking that needs at most ``WORKSPACE_BYTES`` of
scratch, chosen once per shape: a resumed training run is bit-exact, as
with the CuPy kernels (bench/gpu_resume.py).
"""
import ctypes

import numpy

from minichain import backend, kernels
from minichain.configuration import fp32_math
from minichain.functions import convolution as _conv
from minichain.functions.geometry import conv_outsize
from minichain.kernels.cudnn import _lib

WORKSPACE_BYTES = 512 << 20
_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)
# kind -> (heuristic call, run call, how many algorithms cuDNN has)
_KINDS = {
    'forward': ('cudnnGetConvolutionForwardAlgorithm_v7',
                'cudnnConvolutionForward', 8),
    'data': ('cudnnGetConvolutionBackwardDataAlgorithm_v7',
             'cudnnConvolutionBackwardData', 6),
    'filter': ('cudnnGetConvolutionBackwardFilterAlgorithm_v7',
               'cudnnConvolutionBackwardFilter', 7),
}
_algorithms = {}


def fits(node, *arrays):
    """Whether cuDNN takes these arrays for this node."""
    return (kernels.on_cupy(arrays)
            and all(a.ndim == 4 and a.dtype in _lib.DATA for a in arrays)
            and len({a.dtype for a in arrays}) == 1
            and not node.cover_all)


def _math(dtype):
    # config.fp32_math 'tf32' and 'bf16' mean TF32 here, as for the CuPy
    # kernels (kernels/cuda's under_fp32_math), which set cuBLAS's mode.
    if (dtype == numpy.float16 or fp32_math() != 'strict'
            or backend.tf32_enabled()):
        return _lib.TENSOR_OP_MATH
    return _lib.FMA_MATH   # no TF32: float32 products stay float32


def plan(node, x_shape, w_shape, y_shape, dtype):
    """The descriptors ``(x, w, conv, y)`` of ``y = conv(x, w)``, or None
    when cuDNN's output shape is not ``y_shape``."""
    x = _lib.tensor_desc(x_shape, dtype)
    w = _lib.filter_desc(w_shape, dtype)
    conv = _lib.conv_desc(node.pad, node.stride, node.dilate, node.groups,
                          _math(dtype))
    if _lib.forward_output_dim(conv, x, w) != tuple(y_shape):
        return None
    return x, w, conv, _lib.tensor_desc(y_shape, dtype)


def _product(kind, node, a, b, x_shape, w_shape, y_shape):
    """One of the three products of ``y = conv(x, w)`` into a new array:
    ``a``, ``b`` are (x, w) for the forward, (w, dy) for the data
    gradient, (x, dy) for the filter's; None (declined) when cuDNN would
    size the output otherwise."""
    descs = plan(node, x_shape, w_shape, y_shape, a.dtype)
    if descs is None:
        return None
    node.retain_inputs((0, 1))
    cupy = backend.get_cupy()
    out = cupy.empty({'forward': y_shape, 'data': x_shape,
                      'filter': w_shape}[kind], a.dtype)
    x, w, conv, y = descs
    first = {'forward': (x, w), 'data': (w, y), 'filter': (x, y)}[kind]
    last = {'forward': y, 'data': x, 'filter': w}[kind]
    shapes = (x_shape, w_shape, y_shape)
    with out.device:
        h = _lib.handle(out.device.id, cupy.cuda.get_current_stream().ptr)
        algo, nbytes = _algorithm(kind, h, first + (conv, last), shapes)
        work = cupy.empty(nbytes, numpy.uint8) if nbytes else None
        a, b = cupy.ascontiguousarray(a), cupy.ascontiguousarray(b)
        _lib.call(_KINDS[kind][1], h, ctypes.addressof(_ONE), first[0],
                  a.data.ptr, first[1], b.data.ptr, conv, algo,
                  None if work is None else work.data.ptr, nbytes,
                  ctypes.addressof(_ZERO), last, out.data.ptr,
                  where='{} of x {}, W {}, y {}'.format(kind, *shapes))
    return out


def _algorithm(kind, h, descs, shapes):
    """``(algorithm, workspace bytes)``: cuDNN's best-ranked deterministic
    one within WORKSPACE_BYTES, once per shape."""
    key = (kind,) + tuple(d.value for d in descs)
    if key not in _algorithms:
        ask, _, count = _KINDS[kind]
        perf = (_lib.AlgoPerf * count)()
        n = ctypes.c_int()
        _lib.call(ask, h, *descs, count, ctypes.byref(n), perf,
                  where='{} {}'.format(kind, shapes))
        usable = [(p.algo, p.memory) for p in perf[:n.value]
                  if p.status == _lib.SUCCESS and p.memory <= WORKSPACE_BYTES
                  and p.determinism == _lib.DETERMINISTIC]
        if not usable:
            raise RuntimeError('cuDNN: no deterministic {} algorithm within '
                               '{} MiB of workspace for {}'.format(
                                   kind, WORKSPACE_BYTES >> 20, shapes))
        _algorithms[key] = usable[0]
    return _algorithms[key]


def _plus_bias(y, inputs):
    if y is not None and len(inputs) == 3:
        y += inputs[2].reshape(1, -1, 1, 1)
    return None if y is None else (y,)


# -- the kernels: the nodes' forward, same retained inputs --------------
def convolution_2d(node, inputs):
    """``Convolution2D.forward``: y = conv(x, W) (+ b)."""
    x, W = inputs[:2]
    if not fits(node, x, W):
        return None
    out = tuple(conv_outsize(x.shape[2 + a], W.shape[2 + a], node.stride[a],
                             node.pad[a], False, node.dilate[a])
                for a in (0, 1))
    return _plus_bias(_product('forward', node, x, W, x.shape, W.shape,
                               (x.shape[0], W.shape[0]) + out), inputs)


def deconvolution_2d(node, inputs):
    """``Deconvolution2D.forward``: y = conv^T(x, W) (+ b), cuDNN's data
    gradient of the convolution whose output x is."""
    x, W = inputs[:2]
    if not fits(node, x, W) or node.outsize is None:
        return None
    y_shape = (x.shape[0], W.shape[1] * node.groups) + tuple(node.outsize)
    return _plus_bias(_product('data', node, W, x, y_shape, W.shape,
                               x.shape), inputs)


def convolution_2d_grad_w(node, inputs):
    """``Convolution2DGradW.forward``: gW from x and gy."""
    x, gy = inputs
    if not fits(node, x, gy):
        return None
    gw = _product('filter', node, x, gy, x.shape, node.w_shape, gy.shape)
    return None if gw is None else (gw,)


KERNELS = {_conv.Convolution2D: convolution_2d,
           _conv.Deconvolution2D: deconvolution_2d,
           _conv.Convolution2DGradW: convolution_2d_grad_w}
