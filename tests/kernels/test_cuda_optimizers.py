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
    if flat.size:
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


# -- the whole step in one launch (momentum_sgd_all) --------------------------
_SHAPES = [(37, 11), (0,), (5,), (1,), (3, 3, 4)]


def _step(xp, rng, dtype):
    """Pairs of rules and parameters of several sizes (one empty), with
    one rule's own rate and another's own weight decay, ready to step."""
    opt = MomentumSGD(0.1, 0.9, 5e-4)
    pairs = [_rule_and_param(xp, rng, s, dtype, 0.1, 0.9, 0)
             for s in _SHAPES]
    for rule, _ in pairs:
        rule.hyperparam = type(rule.hyperparam)(opt.hyperparam)
    pairs[0][0].hyperparam.lr = 0.03
    pairs[2][0].hyperparam.weight_decay_rate = 0
    return pairs


def _bodies(pairs):
    """Copies of ``pairs`` stepped by ``update_core``."""
    done = []
    for rule, param in pairs:
        body = MomentumSGDRule(rule.hyperparam)
        body.state = {'v': rule.state['v'].copy()}
        body_param = minichain.Parameter(param.array.copy())
        body_param.grad = param.grad
        body.update_core(body_param)
        done.append((body, body_param))
    return done


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
def test_the_emulated_one_launch_step_is_the_body_bit_for_bit(
        dtype, monkeypatch):
    _emulated_kernel()  # (skips without a compiler)
    fake = types.SimpleNamespace(
        asarray=numpy.asarray,
        ElementwiseKernel=lambda i, o, op, name, preamble: (
            cuda_emulation.ElementwiseKernel(
                i, o, op, name, preamble=_HOST + preamble)))
    monkeypatch.setattr(backend, 'get_cupy', lambda: fake)
    monkeypatch.setattr(K, '_kernel_all', [])
    monkeypatch.setattr(K, '_ptr', lambda a: a.ctypes.data)
    pairs = _step(numpy, numpy.random.default_rng(3), dtype)
    want = _bodies(pairs)
    K.launch_all(pairs, numpy.dtype(dtype))
    for (rule, param), (body, body_param) in zip(pairs, want):
        assert param.array.tobytes() == body_param.array.tobytes()
        assert rule.state['v'].tobytes() == body.state['v'].tobytes()


def test_numpy_pairs_are_left_untouched_and_the_step_kernel_registered():
    pairs = _step(numpy, numpy.random.default_rng(4), numpy.float32)
    assert K.momentum_sgd_all(pairs) == pairs
    assert [rule.t for rule, _ in pairs] == [0] * len(pairs)
    assert kernels.registered(kernels.UpdateAll, 'cuda') is K.momentum_sgd_all


def test_the_optimizer_offers_its_step_between_the_hooks(monkeypatch):
    """GradientMethod.update gives every parameter to the UpdateAll
    kernels after the 'pre' hooks (here a weight decay) and before the
    'post' ones; the pairs they return, and only those, step one by one
    (with the kernels off, all of them)."""
    from minichain.optimizer_hooks import WeightDecay
    from tests._holder import Holder
    rng = numpy.random.default_rng(7)
    arrays = {n: rng.standard_normal(s) for n, s in
              (('a', (3, 2)), ('b', (4,)), ('c', (1,)))}
    results, log = [], []

    def take_first(pairs):
        log.append(('all', [p.name for _, p in pairs]))
        rule, param = pairs[0]
        assert rule.prepare(param)
        rule.update_core(param)
        return pairs[1:]
    monkeypatch.setitem(kernels.registry, (kernels.UpdateAll, 'numpy'),
                        take_first)
    for use in (True, False):
        link = Holder(**{n: a.copy() for n, a in arrays.items()})
        opt = MomentumSGD(0.1, 0.9).setup(link)
        opt.add_hook(WeightDecay(1e-2))
        opt.add_hook(lambda o: log.append('pre'), name='pre')
        opt.add_hook(lambda o: log.append('post'), timing='post', name='post')
        with minichain.using_config('use_kernels', use), \
                minichain.using_config('use_onednn', 'never'):
            for _ in range(2):
                for name, param in link.namedparams():
                    param.grad = numpy.cos(arrays[name[1:]])
                opt.update()
        results.append([p.array for p in link.params()])
        assert [p.update_rule.t for p in link.params()] == [2, 2, 2]
    assert log == ['pre', ('all', ['a', 'b', 'c']), 'post'] * 2 + ['pre',
                                                                 'post'] * 2
    for got, want in zip(*results):
        assert got.tobytes() == want.tobytes()


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
def test_the_one_launch_step_is_the_body_on_a_device(dtype):
    cupy = backend.get_cupy()
    pairs = _step(cupy, numpy.random.default_rng(5), dtype)
    want = _bodies(pairs)
    # a strided gradient is left to the per-parameter path
    odd = _rule_and_param(cupy, numpy.random.default_rng(6), (4, 6),
                          dtype, 0.1, 0.9, 0)
    odd[1].grad = cupy.asfortranarray(odd[1].grad)
    rest = K.momentum_sgd_all(pairs + [odd])
    assert rest == [odd] and odd[0].t == 0
    assert [rule.t for rule, _ in pairs] == [1] * len(pairs)
    for (rule, param), (body, body_param) in zip(pairs, want):
        for got, ref in ((param.array, body_param.array),
                         (rule.state['v'], body.state['v'])):
            assert (backend.to_cpu(got).tobytes()
                    == backend.to_cpu(ref).tobytes())
