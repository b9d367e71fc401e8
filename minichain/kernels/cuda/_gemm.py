"""Batched matrix products in one ``cublasGemmStridedBatchedEx`` call.

CuPy's N-D ``matmul`` of float16 operands misses the tensor cores (issue
40's reading); here a batch of products ``a[i] @ b[i]`` is one cuBLAS call
with float16 or float32 data and float32 accumulation
(``CUBLAS_COMPUTE_32F``): float16 runs on the tensor cores, float32 on
TF32 ones only when the handle's math mode allows it
(:func:`minichain.backend.set_tf32`, ``config.fp32_math``), as before. An
operand broadcast over the batch is read with batch stride 0, never copied.
cuBLAS is column-major: the row-major ``C = A @ B`` is its ``C^T = B^T
A^T``, so B goes first. Tested against ``numpy.matmul`` with a stand-in
of the cuBLAS call on the CPU (tests/kernels/cuda/test_gemm.py).
"""
import math

import numpy

from minichain import backend, kernels

_ALPHA_BETA = numpy.array([1, 0], numpy.float32)  # host scalars, 32F compute
_DATA = {'float16': 'CUDA_R_16F', 'float32': 'CUDA_R_32F'}  # cudaDataType


def _ptr(array):
    return array.data.ptr


def _on_current_device(*arrays):
    current = backend.get_cupy().cuda.Device().id
    return all(a.device.id == current for a in arrays)


def _stride(a, batch):
    """a's batch stride in elements: 0 when it is one matrix broadcast over
    the batch, its matrix size when C-contiguous over all of it."""
    if not a.flags.c_contiguous:
        return None
    if math.prod(a.shape[:-2]) == 1:
        return 0
    return a.shape[-2] * a.shape[-1] if a.shape[:-2] == batch else None


def matmul(a, b, out=None):
    """``xp.matmul(a, b, out=out)``, on cuBLAS in one call for CuPy float16
    and float32 operands of more than two dimensions, C-contiguous or
    broadcast (a batch of one)."""
    xp = backend.get_array_module(a)
    batch = None
    if (a.ndim > 2 or b.ndim > 2) and min(a.ndim, b.ndim) >= 2:
        batch = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        (m, k), n = a.shape[-2:], b.shape[-1]
    if not (batch is not None and kernels.on_cupy((a, b))
            and a.dtype == b.dtype and a.dtype.name in _DATA
            and k == b.shape[-2] and 0 not in batch + (m, n, k)
            and _stride(a, batch) is not None
            and _stride(b, batch) is not None
            # the current device's cuBLAS handle (CuPy's matmul checks
            # peer access for arrays of another device)
            and _on_current_device(a, b)
            and (out is None or (out.dtype == a.dtype
                                 and out.shape == batch + (m, n)
                                 and out.flags.c_contiguous))):
        return xp.matmul(a, b, out=out)
    if out is None:
        out = xp.empty(batch + (m, n), a.dtype)
    cupy, cublas = backend.get_cupy(), backend.get_cublas()
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    t = getattr(cupy.cuda.runtime, _DATA[a.dtype.name])
    one = _ALPHA_BETA.ctypes.data
    cublas.gemmStridedBatchedEx(
        handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k,
        one, _ptr(b), t, n, _stride(b, batch), _ptr(a), t, k,
        _stride(a, batch), one + 4, _ptr(out), t, n, m * n,
        math.prod(batch), cublas.CUBLAS_COMPUTE_32F,
        cublas.CUBLAS_GEMM_DEFAULT)
    return out
