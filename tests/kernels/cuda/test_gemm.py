"""minichain/kernels/cuda/_gemm.py's one cuBLAS call, made on NumPy arrays
against a stand-in of ``cublasGemmStridedBatchedEx`` that follows cuBLAS's
contract (column-major matrices, leading dimensions, batch strides, host
alpha and beta, C unread when beta is 0), equals ``numpy.matmul``: a
weight broadcast over the images as the convolutions pass it, batches on
both sides, float16 and float32; what it does not take goes to matmul.
On a device (``-m gpu``): cuBLAS itself against CuPy's matmul."""
import ctypes
import types

import numpy
import pytest

from minichain import backend, kernels
from minichain.kernels.cuda import _gemm
from tests.functions import cuda_emulation
from tests.functions.cuda_emulation import emulated_cuda  # noqa: F401

_DTYPES = {2: numpy.float16, 0: numpy.float32}  # cudaDataType


class _Cublas:
    """The cuBLAS names ``_gemm`` uses; the GEMM done by NumPy."""
    CUBLAS_OP_N, CUBLAS_POINTER_MODE_HOST = 0, 0
    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT = 68, -1

    def __init__(self):
        self.calls = 0

    def setStream(self, handle, stream):
        pass

    def setPointerMode(self, handle, mode):
        assert mode == self.CUBLAS_POINTER_MODE_HOST

    def gemmStridedBatchedEx(self, handle, ta, tb, m, n, k, alpha, A, at,
                             lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc,
                             count, compute, algo):
        assert (ta, tb, compute, algo) == (0, 0, 68, -1)
        assert at == bt == ct and lda >= m and ldb >= k and ldc >= m
        dtype = numpy.dtype(_DTYPES[at])
        alpha, beta = (ctypes.c_float.from_address(p).value
                       for p in (alpha, beta))

        def batch(ptr, rows, cols, ld, stride):
            span = ((count - 1) * stride + (cols - 1) * ld + rows)
            buf = (ctypes.c_byte * (span * dtype.itemsize)).from_address(ptr)
            return numpy.ndarray((count, rows, cols), dtype, buffer=buf,
                                 strides=(stride * dtype.itemsize,
                                          dtype.itemsize,
                                          ld * dtype.itemsize))
        a, b, c = (batch(A, m, k, lda, sa), batch(B, k, n, ldb, sb),
                   batch(C, m, n, ldc, sc))
        prod = alpha * numpy.matmul(a.astype(numpy.float32),
                                    b.astype(numpy.float32))
        c[...] = prod if beta == 0 else prod + beta * c
        self.calls += 1


@pytest.fixture
def cublas(monkeypatch):
    fake = _Cublas()
    cupy = cuda_emulation.fake_cupy()  # (with the emulated kernels)
    cupy.cuda = types.SimpleNamespace(
        device=types.SimpleNamespace(get_cublas_handle=lambda: 1),
        get_current_stream=lambda: types.SimpleNamespace(ptr=0),
        runtime=types.SimpleNamespace(CUDA_R_16F=2, CUDA_R_32F=0))
    monkeypatch.setattr(backend, 'get_cupy', lambda: cupy)
    monkeypatch.setattr(backend, 'get_cublas', lambda: fake)
    monkeypatch.setattr(kernels, 'on_cupy', lambda arrays: True)
    monkeypatch.setattr(_gemm, '_ptr', lambda a: a.ctypes.data)
    monkeypatch.setattr(_gemm, '_on_current_device', lambda *arrays: True)
    return fake


CASES = [((1, 8, 12), (5, 1, 12, 7)),   # a 1x1 convolution's W @ x[n]
         ((3, 4, 5), (3, 5, 6)), ((2, 3, 4, 5), (5, 6)),
         ((4, 5), (3, 5, 6)), ((2, 1, 4, 5), (2, 1, 5, 3))]


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
@pytest.mark.parametrize('shapes', CASES, ids=str)
def test_the_call_is_numpys_matmul(cublas, shapes, dtype):
    rng = numpy.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    want = numpy.matmul(a.astype(numpy.float32), b.astype(numpy.float32))
    got = _gemm.matmul(a, b)
    out = numpy.full(want.shape, numpy.nan, dtype)
    assert _gemm.matmul(a, b, out=out) is out
    assert cublas.calls == 2
    for g in (got, out):
        assert g.dtype == dtype
        numpy.testing.assert_allclose(g, want, rtol=2e-3 if dtype ==
                                      numpy.float16 else 1e-6, atol=1e-2)


_F32 = numpy.float32


@pytest.mark.parametrize('a,b', [
    (numpy.ones((2, 4, 6), _F32), numpy.ones((5, 2, 6, 7), _F32)),  # groups
    (numpy.ones((3, 5, 4), _F32).transpose(0, 2, 1),
     numpy.ones((3, 5, 6), _F32)),
    (numpy.ones((3, 4, 5)), numpy.ones((3, 5, 6))),                # float64
    (numpy.ones((4, 5), _F32), numpy.ones((5, 6), _F32)),  # 2-D: CuPy's dot
    (numpy.ones(5, _F32), numpy.ones((3, 5, 6), _F32))])
def test_what_it_does_not_take_goes_to_matmul(cublas, a, b):
    numpy.testing.assert_array_equal(_gemm.matmul(a, b), numpy.matmul(a, b))
    assert cublas.calls == 0


def test_the_convolutions_equal_their_bodies_through_the_call(
        emulated_cuda, cublas):  # noqa: F811
    """tests/kernels/cuda/test_convolution.py's cases, every batched
    product of the 1x1 and im2col routes made by the stand-in."""
    from tests.kernels.cuda import test_convolution as T
    for case in ('1x1 56 in', '3x3/2 56', '1x1/2 28 projection',
                 'uneven pads and dilations'):
        T.test_convolution_equals_the_body(case)
        T.test_deconvolution_equals_the_body(case)
    assert cublas.calls >= 16


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('dtype', ['float16', 'float32'])
@pytest.mark.parametrize('shapes', CASES, ids=str)
def test_cublas_equals_cupys_matmul_on_a_device(shapes, dtype):
    cupy = backend.get_cupy()
    rng = numpy.random.default_rng(1)
    a, b = (cupy.asarray(rng.standard_normal(s).astype(dtype))
            for s in shapes)
    want = backend.to_cpu(cupy.matmul(a.astype('float32'),
                                      b.astype('float32')))
    got = backend.to_cpu(_gemm.matmul(a, b))
    assert got.dtype == dtype
    numpy.testing.assert_allclose(got.astype('float32'), want, atol=1e-2,
                                  rtol=2e-3 if dtype == 'float16' else 1e-5)
