"""The cuDNN kernels (minichain/kernels/cudnn).

Three levels: without cuDNN (every CI run: the registry, declining, the
message of a missing library); with the library but no GPU (loading, its
version, descriptors and the output shapes cuDNN computes: where the
``cudnn`` extra is installed); on a device (``-m gpu``: each kernel
against its op's body at ResNet-50's shapes, float32 and float16).
"""
import os
import subprocess
import sys

import numpy
import pytest

import minichain
from minichain import backend, kernel_seam, kernels
from minichain.functions import convolution as C
from minichain.functions import normalization as N
from minichain.functions.channel_layout import Layout
from minichain.kernels import cudnn, testing
from minichain.kernels.cudnn import _lib
from minichain.kernels.cudnn import convolution as K
from tests.kernels.cuda.test_convolution import CASES, _setup

NODES = (C.Convolution2D, C.Deconvolution2D, C.Convolution2DGradW,
         N.BatchNormalization, N.BatchNormalizationGrad,
         N.FixedBatchNormalization)
needs_library = pytest.mark.skipif(
    bool(cudnn.problem()), reason='cuDNN cannot be used here ({}); pip '
    'install -e ".[cudnn]" runs these'.format(cudnn.problem()))


def on_device(test):
    for mark in (pytest.mark.gpu, needs_library, pytest.mark.skipif(
            not backend.gpu_available(), reason='no CUDA GPU')):
        test = mark(test)
    return test


# -- without cuDNN --------------------------------------------------------
def test_cudnn_is_tried_before_the_cupy_kernels_for_every_node():
    assert kernel_seam._order['gpu'][:2] == ('cudnn', 'cuda')
    for node_type in NODES:
        assert kernels.registered(node_type, 'cudnn') is not None, node_type


def test_the_kernels_decline_numpy_arrays():
    x = numpy.ones((2, 3, 5, 5), numpy.float32)
    W = numpy.ones((4, 3, 3, 3), numpy.float32)
    node = C.Convolution2D((1, 1), (1, 1), False, (1, 1), 1)
    assert kernels.registered(C.Convolution2D, 'cudnn')(node, (x, W)) is None
    bn = N.BatchNormalization(Layout(x.shape, (0, 2, 3)), 2e-5, None, None,
                              0.9)
    gamma = numpy.ones(3, numpy.float32)
    assert kernels.registered(N.BatchNormalization, 'cudnn')(
        bn, (x, gamma, gamma)) is None
    grad = N.BatchNormalizationGrad(bn.lay, 2e-5, gamma, gamma, True)
    assert kernels.registered(N.BatchNormalizationGrad, 'cudnn')(
        grad, (x, gamma, x, x)) is None  # (x, gamma, gy, y)


_ASK = '''
from minichain.kernels import cudnn
print(cudnn.enabled())
'''


@pytest.mark.parametrize('mode', ['auto', 'always', 'never'])
def test_a_missing_library(tmp_path, mode):
    env = dict(os.environ, MINICHAIN_CUDNN=mode,
               MINICHAIN_CUDNN_LIBRARY=str(tmp_path / 'libcudnn.so.9'))
    done = subprocess.run([sys.executable, '-c', _ASK], env=env, text=True,
                          capture_output=True, timeout=120)
    if mode != 'always':  # the CuPy kernels, silently
        assert done.stdout.strip() == 'False' and not done.stderr
        return
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: config.use_cudnn is 'always' but "
                           "cuDNN cannot be used: cuDNN 9 was not found: "
                           "tried " + str(tmp_path)), last
    assert 'pip install nvidia-cudnn-cu13' in last
    assert 'MINICHAIN_CUDNN=auto' in last


# -- with the library, without a device ----------------------------------
@needs_library
def test_the_library_loads_and_says_what_it_is():
    v, cuda = _lib.version()
    assert v >= 90000 and cuda >= 12000
    line = cudnn.describe()
    assert line.startswith('cuDNN 9.') and 'libcudnn.so.9' in line, line


@needs_library
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float16])
@pytest.mark.parametrize('case', sorted(CASES))
def test_cudnn_sizes_every_output_as_the_body(case, dtype):
    xs, ws, s, p, d, groups, cover_all, out = _setup(case)
    node = C.Convolution2D(s, p, cover_all, d, groups)
    descs = K.plan(node, xs, ws, xs[:1] + ws[:1] + out, dtype)
    assert (descs is None) == cover_all, case  # cover_all reads past pad
    if not cover_all:
        # a deconvolution to an outsize this convolution cannot come from
        bigger = xs[:2] + (xs[2] + s[0] * 2, xs[3])
        assert K.plan(node, bigger, ws, xs[:1] + ws[:1] + out, dtype) is None


@needs_library
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float16])
def test_batch_normalization_descriptors(dtype):
    for shape in ((8, 64, 56, 56), (32, 2048)):
        assert _lib.bn_desc(_lib.tensor_desc(shape, dtype)).value


# -- on a device ----------------------------------------------------------
def _gpu(a, dtype):
    return backend.to_gpu(numpy.asarray(a, dtype))


def _tol(dtype, n_terms, scale):
    return testing.sum_tolerance(n_terms, scale, dtype, factor=16.0)


def _check(node, inputs, n_terms, dtype):
    kernel = kernels.registered(type(node), 'cudnn')
    with minichain.using_config('use_cudnn', 'always'):
        got, want = testing.run_both(kernel, node, inputs)[::2]
    assert got is not None, 'declined: {}'.format(type(node).__name__)
    for g, w in zip(got, want):
        scale = float(abs(w).max()) or 1.0
        assert g.dtype == w.dtype and g.shape == w.shape
        err = float(abs(g.astype(numpy.float32) - w.astype(numpy.float32))
                    .max())
        assert err <= _tol(dtype, n_terms, scale), (type(node).__name__,
                                                     err, scale)


@on_device
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float16])
@pytest.mark.parametrize('case', sorted(c for c in CASES if not CASES[c][6]))
def test_each_convolution_kernel_equals_the_body(case, dtype):
    xs, ws, s, p, d, groups, cover_all, out = _setup(case)
    rng = numpy.random.default_rng(0)
    x, W = _gpu(rng.standard_normal(xs), dtype), _gpu(
        rng.standard_normal(ws) * 0.1, dtype)
    gy = _gpu(rng.standard_normal(xs[:1] + ws[:1] + out), dtype)
    k = ws[1] * ws[2] * ws[3]
    _check(C.Convolution2D(s, p, False, d, groups), (x, W), k, dtype)
    _check(C.Deconvolution2D(s, p, xs[2:], False, d, groups), (gy, W),
           ws[0] * ws[2] * ws[3], dtype)
    _check(C.Convolution2DGradW(ws, s, p, False, d, groups), (x, gy),
           xs[0] * out[0] * out[1], dtype)


@on_device
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float16])
@pytest.mark.parametrize('shape', [(8, 64, 56, 56), (8, 2048, 7, 7),
                                   (16, 10)])
@pytest.mark.parametrize('residual_relu', [False, True])
def test_each_batch_normalization_kernel_equals_the_body(shape, dtype,
                                                         residual_relu):
    rng = numpy.random.default_rng(1)
    axes = (0,) + tuple(range(2, len(shape)))
    lay = Layout(shape, axes)
    x = _gpu(rng.standard_normal(shape) * 3 + 1, dtype)
    gamma, beta = (_gpu(rng.standard_normal(shape[1]), dtype)
                   for _ in range(2))
    mean, var = _gpu(rng.standard_normal(shape[1]), dtype), _gpu(
        rng.uniform(0.5, 2, shape[1]), dtype)
    inputs = (x, gamma, beta) + ((_gpu(rng.standard_normal(shape), dtype),)
                                 if residual_relu else ())
    running = [backend.to_gpu(numpy.zeros(shape[1], numpy.float32))
               for _ in range(2)]
    _check(N.BatchNormalization(lay, 2e-5, *running, 0.9, residual_relu),
           inputs, lay.m, dtype)
    forward = N.BatchNormalization(lay, 2e-5, None, None, 0.9)
    y, = forward.forward((x, gamma, beta))  # the statistics backward reads
    _check(N.BatchNormalizationGrad(lay, 2e-5, forward.mean,
                                    forward.inv_std, True),
           (x, gamma, _gpu(rng.standard_normal(shape), dtype))
           + ((y,) if residual_relu else ()),  # y: gy masked by y > 0
           lay.m, dtype)
    _check(N.FixedBatchNormalization(lay, 2e-5),
           (x, gamma, beta, mean, var), 4, dtype)
