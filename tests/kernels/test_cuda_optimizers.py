"""MomentumSGD's one-launch CuPy update (minichain/kernels/cuda/
optimizers.py) equals the rule's body bit for bit: here its kernel runs as
C++ on the CPU (tests/functions/cuda_emulation.py; plain IEEE operations
where NVRTC has the round-to-nearest intrinsics: x86-64 fuses neither);
on a device (``-m gpu``) the kernel itself through the seam."""
import types

import numpy
import pytest

import minichain
from minichain import backend, kernels
from minichain.kernels.cuda import optimizers as K
from minichain.optimizers import MomentumSGD
from minichain.optimizers.momentum_sgd import MomentumSGDRule
from tests.functions import cuda_emulation

# the preamble's __device__ functions as host code (the intrinsics'
# overloads are NVRTC's only: here the plain IEEE operations)
_HOST = '#define __device__\n'


def _emulated_kernel():
    if cuda_emulation.CXX is None:
        pytest.skip('no C++ compiler to emulate the CUDA kernels')
    fake = types.SimpleNamespace(
        ElementwiseKernel=lambda i, o, op, name, preamble: (
            cuda_emulation.ElementwiseKernel(
                i, o, op, name, preamble=_HOST + preamble)))
    return K.make_kernel(fake)


def _values(rng, shape, dtype):
    """Random values with the edges a step can meet: NaN, the infinities,
    signed zeros, tiny and huge numbers."""
    a = rng.standard_normal(shape).astype(dtype)
    edges = numpy.array([numpy.nan, numpy.inf, -numpy.inf, 0.0, -0.0, 1e-30,
                         -3e30], dtype)
    flat = a.reshape(-1)
    flat[rng.integers(0, flat.size, 40)] = rng.choice(edges, 40)
    return a


def _rule_and_param(xp, rng, shape, dtype, lr, mu, wd):
    opt = MomentumSGD(lr, mu, wd)
    rule = MomentumSGDRule(opt.hyperparam)
    param = minichain.Parameter(xp.asarray(_values(rng, shape, dtype)))
    param.grad = xp.asarray(_values(rng, shape, dtype))
    rule.init_state(param)
    rule.state['v'] = xp.asarray(_values(rng, shape, dtype))
    return rule, param


@pytest.mark.parametrize('wd', [0, 5e-4])
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
def test_the_emulated_kernel_is_the_body_bit_for_bit(dtype, wd):
    kernel = _emulated_kernel()
    rng = numpy.random.default_rng(0)
    rule, param = _rule_and_param(numpy, rng, (37, 11), dtype, 0.1, 0.9, wd)
    p, v = param.array.copy(), rule.state['v'].copy()
    kernel(param.grad, 0.1, 0.9, wd, bool(wd), p, v)
    rule.update_core(param)
    for got, want in ((p, param.array), (v, rule.state['v'])):
        assert got.tobytes() == want.tobytes()


def test_numpy_arrays_are_declined_and_the_rule_is_registered():
    rng = numpy.random.default_rng(1)
    rule, param = _rule_and_param(numpy, rng, (3,), numpy.float32, 0.1, 0.9,
                                  0)
    assert K.momentum_sgd(rule, param) is None
    assert kernels.registered(MomentumSGDRule, 'cuda') is K.momentum_sgd


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('wd', [0, 5e-4])
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
def test_the_kernel_is_the_body_on_a_device(dtype, wd):
    cupy = backend.get_cupy()
    rng = numpy.random.default_rng(2)
    rule, param = _rule_and_param(cupy, rng, (64, 3, 3, 3), dtype, 0.1,
                                  0.9, wd)
    body_param = minichain.Parameter(param.array.copy())
    body_param.grad = param.grad.copy()
    body_rule = MomentumSGDRule(rule.hyperparam)
    body_rule.state = {'v': rule.state['v'].copy()}
    assert K.momentum_sgd(rule, param) is True
    body_rule.update_core(body_param)
    for got, want in ((param.array, body_param.array),
                      (rule.state['v'], body_rule.state['v'])):
        assert backend.to_cpu(got).tobytes() == backend.to_cpu(want).tobytes()
