"""Batch normalization's CUDA kernels (minichain/kernels/cuda/
normalization.py: two reductions, the per-channel kernel, the pass over x
with the residual and ReLU, each way), run on NumPy arrays with every
elementwise kernel and every reduction's map expression emulated in C++
(the reductions' sums in NumPy), equal the op bodies: at the main job's
ResNet-50 step, within tests/kernels/test_kernels_equal_bodies.py's
tolerances, and in float64 with a residual, ReLU and running statistics."""
import types

import numpy
import pytest

from minichain import backend, kernels
from minichain.functions import normalization as N
from minichain.kernels import testing
from minichain.kernels.cuda import normalization as K
from tests.functions import cuda_emulation
from tests.kernels import test_kernels_equal_bodies as E

_HOST = '#include <cmath>\nusing std::sqrt;\n'


class _Elementwise:
    """cupy.ElementwiseKernel's call as the CUDA path makes it: inputs
    broadcast, outputs allocated unless given."""

    def __init__(self, in_params, out_params, operation, name='kernel'):
        self.k = cuda_emulation.ElementwiseKernel(
            in_params, out_params, operation, name, preamble=_HOST)

    def __call__(self, *args):
        n = len(self.k.ins)
        shape = numpy.broadcast_shapes(*[
            a.shape for a in args[:n] if isinstance(a, numpy.ndarray)])
        ins = [numpy.ascontiguousarray(numpy.broadcast_to(a, shape))
               if isinstance(a, numpy.ndarray) else a for a in args[:n]]
        outs = list(args[n:])
        if not outs:
            dtypes = {t: a.dtype for (_, t, _), a in zip(self.k.ins, ins)
                      if isinstance(a, numpy.ndarray)}
            outs = [numpy.empty(shape, dtypes.get(t, t))
                    for _, t, _ in self.k.outs]
        self.k(*ins, *outs)
        return outs[0] if len(outs) == 1 else tuple(outs)


class _Reduction:
    """cupy.ReductionKernel: the map expression emulated, summed by NumPy."""

    def __init__(self, in_params, out_params, map_expr, *args, **kwds):
        self.acc = out_params.split()[0]
        self.map = _Elementwise(in_params, self.acc + ' y_',
                                'y_ = ' + map_expr)

    def __call__(self, *args, axis):
        return self.map(*args).sum(axis=axis, dtype=self.acc)


@pytest.fixture
def _kernels_in_cpp(monkeypatch):
    if cuda_emulation.CXX is None:
        pytest.skip('no C++ compiler to emulate the CUDA kernels')
    fake = types.SimpleNamespace(
        ElementwiseKernel=_Elementwise, ReductionKernel=_Reduction,
        empty=numpy.empty, empty_like=numpy.empty_like, sqrt=numpy.sqrt)
    monkeypatch.setattr(backend, 'get_cupy', lambda: fake)
    monkeypatch.setattr(K, '_gpu_kernels', {})
    monkeypatch.setattr(kernels, 'on_cupy', lambda arrays: True)


_NODES = ('BatchNormalization', 'BatchNormalizationGrad',
          'FixedBatchNormalization')


def _main_job_cases():
    return [c for key, c in E._cases('28:small2').items()
            if key[0] in _NODES]


@pytest.mark.usefixtures('_kernels_in_cpp')
def test_the_kernels_equal_the_bodies_at_the_main_jobs_step():
    cases = _main_job_cases()
    assert {type(node).__name__ for node, _ in cases} == set(_NODES)
    assert any(len(ins) == 4 and node.relu for node, ins in cases
               if isinstance(node, N.BatchNormalization))
    # relu without a residual: its backward given y (gy masked first)
    assert any(len(ins) == 4 for node, ins in cases
               if isinstance(node, N.BatchNormalizationGrad))
    for node, inputs in cases:
        atol, attr_atol = E._tolerances(node, inputs)
        testing.assert_kernel_equals_body(
            kernels.registered(type(node), 'cuda'), node, inputs,
            atol=atol, attr_atol=attr_atol, hints=('centered',))


@pytest.mark.usefixtures('_kernels_in_cpp')
@pytest.mark.parametrize('residual', [False, True])
def test_float64_with_residual_relu_and_running_statistics(residual):
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((3, 5, 4, 2)) * 3 + 1
    gamma, beta = rng.standard_normal(5), rng.standard_normal(5)
    lay = N._layout('batch_normalization', x, gamma, None,
                    (('beta', beta),))
    node = N.BatchNormalization(lay, 2e-5, rng.random(5), rng.random(5) + 1,
                                0.9, relu=True)
    inputs = (x, gamma, beta) + ((rng.standard_normal(x.shape),)
                                 if residual else ())
    out_k, node_k, out_b, node_b = testing.run_both(
        kernels.registered(N.BatchNormalization, 'cuda'), node, inputs)
    numpy.testing.assert_allclose(out_k[0], out_b[0], rtol=0, atol=1e-13)
    for name in ('mean', 'inv_std', 'running_mean', 'running_var'):
        numpy.testing.assert_allclose(getattr(node_k, name),
                                      getattr(node_b, name), rtol=1e-14)
    gy = rng.standard_normal(x.shape)
    grad = N.BatchNormalizationGrad(lay, 2e-5, node_b.mean, node_b.inv_std,
                                    True)
    y = () if residual else (out_b[0],)  # relu's backward given y
    testing.assert_kernel_equals_body(
        kernels.registered(N.BatchNormalizationGrad, 'cuda'), grad,
        (x, gamma, gy) + y, atol=1e-13)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('dtype', ['float32', 'float16'])
def test_the_kernels_equal_the_bodies_on_a_device(dtype):
    """The CuPy kernels themselves at the main job's step: float32 within
    the NumPy kernels' tolerances, float16 within two of its units."""
    cupy = backend.get_cupy()
    for node, inputs in _main_job_cases():
        kernel = kernels.registered(type(node), 'cuda')
        atol, attr_atol = E._tolerances(node, inputs)  # (from NumPy's)
        for name, value in list(vars(node).items()):
            if isinstance(value, numpy.ndarray):  # statistics stay float32
                setattr(node, name, cupy.asarray(value.astype(
                    dtype if name.startswith('running') else value.dtype)))
        if dtype == 'float32':
            testing.assert_kernel_equals_body(
                kernel, node, tuple(cupy.asarray(a) for a in inputs),
                atol=atol, attr_atol=attr_atol, hints=('centered',))
            continue
        out_k, _, out_b, _ = testing.run_both(kernel, node, tuple(
            cupy.asarray(a.astype(dtype)) for a in inputs))
        for got, want in zip(out_k, out_b):
            want = backend.to_cpu(want).astype(numpy.float32)
            numpy.testing.assert_allclose(
                backend.to_cpu(got).astype(numpy.float32), want, rtol=2e-3,
                atol=2e-3 * float(numpy.abs(want).max()))
