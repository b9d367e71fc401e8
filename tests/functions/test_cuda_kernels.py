"""minichain's CUDA kernels run on a GPU against the NumPy path, in every
dtype (float16, float32, float64). Skipped without a GPU; without one the
kernels are compiled by ``make cuda-check`` (tests/cuda) and their C++
bodies run on the CPU in tests/functions/test_pooling.py and
test_convolution.py (``cuda_emulation``)."""
import numpy
import pytest

from minichain import backend
from minichain.kernels.cuda import _elementwise as _cuda_kernels
from minichain.kernels.numpy import _im2col
from minichain.functions.pooling import _pool_geometry
from tests.functions.test_pooling import (CASES, IDS, _shuffled, _with_nans,
                                          naive_choice, naive_max)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not backend.gpu_available(), reason='no CUDA GPU')]
DTYPES = [numpy.float16, numpy.float32, numpy.float64]
GEOMETRIES = [_im2col.Geometry(3, 3, 1, 1, 1, 1, 1, 1, 7, 6, 7, 6),
              _im2col.Geometry(3, 2, 2, 1, 0, 1, 2, 1, 9, 6, 3, 7)]


def _tol(dtype):
    return {numpy.float16: 2e-3, numpy.float32: 1e-6,
            numpy.float64: 1e-12}[dtype]


@pytest.mark.parametrize('g', GEOMETRIES)
@pytest.mark.parametrize('dtype', DTYPES)
def test_im2col_col2im_match_numpy(dtype, g):
    x = _shuffled((2, 3, g.h, g.w), dtype)
    want = _im2col.im2col(x, g)
    gx = backend.to_gpu(x)
    for batch_major in (True, False):
        col = _cuda_kernels.im2col(gx, g, batch_major)
        ref = want if batch_major else want.transpose(1, 2, 3, 0, 4, 5)
        numpy.testing.assert_array_equal(backend.to_cpu(col), ref)
        img = _cuda_kernels.col2im(col, g, batch_major)
        numpy.testing.assert_allclose(
            backend.to_cpu(img), _im2col.col2im(want, g), rtol=_tol(dtype),
            atol=_tol(dtype) * 10)


@pytest.mark.parametrize('case', CASES, ids=IDS)
@pytest.mark.parametrize('dtype', DTYPES)
def test_pooling_kernels_match_numpy_nan_included(dtype, case):
    k, s, p, cover_all = case
    x = _with_nans(dtype)
    g = _pool_geometry('test', x, k, s, p, cover_all)
    out, idx = _cuda_kernels.max_pool_forward(backend.to_gpu(x), g)
    numpy.testing.assert_array_equal(backend.to_cpu(out),
                                     naive_max(x, *case).astype(dtype))
    numpy.testing.assert_array_equal(backend.to_cpu(idx),
                                     naive_choice(x, case)[0])
    gy = backend.to_gpu(numpy.ones(out.shape, dtype))
    gx = _cuda_kernels.max_pool_backward(gy, idx, g)
    numpy.testing.assert_array_equal(backend.to_cpu(gx),
                                     naive_choice(x, case)[1])
    g_avg = _pool_geometry('test', x, k, s, p, False)
    xf = _shuffled(x.shape, dtype)
    avg = _cuda_kernels.avg_pool_forward(backend.to_gpu(xf), g_avg)
    from minichain import functions as F
    numpy.testing.assert_allclose(
        backend.to_cpu(avg), F.average_pooling_2d(xf, k, s, p).array,
        rtol=_tol(dtype), atol=_tol(dtype) * 10)
