"""MomentumSGD: two hand-computed steps and the lazily created velocity."""
import numpy
import pytest

import minichain
from minichain import optimizer_hooks, optimizers
from tests._holder import Holder


def test_two_steps_by_hand():
    link = Holder(w=[1.0, 2.0])
    opt = optimizers.MomentumSGD(lr=0.1, momentum=0.9).setup(link)
    rule = link.w.update_rule
    assert rule.state is None  # created at the first update
    link.w.grad = numpy.array([0.5, -1.0])
    opt.update()
    # v = 0.9 * 0 - 0.1 * g = [-0.05, 0.1];  w = [0.95, 2.1]
    numpy.testing.assert_allclose(rule.state['v'], [-0.05, 0.1], atol=1e-15)
    numpy.testing.assert_allclose(link.w.array, [0.95, 2.1], atol=1e-15)
    link.w.grad = numpy.array([1.0, 1.0])
    opt.update()
    # v = 0.9 * [-0.05, 0.1] - 0.1 * [1, 1] = [-0.145, -0.01]
    numpy.testing.assert_allclose(rule.state['v'], [-0.145, -0.01], atol=1e-15)
    numpy.testing.assert_allclose(link.w.array, [0.805, 2.09], atol=1e-15)


def test_lr_and_momentum_settable():
    link = Holder(w=[0.0])
    opt = optimizers.MomentumSGD(lr=1.0, momentum=0.5).setup(link)
    link.w.grad = numpy.array([1.0])
    opt.update()              # v = -1, w = -1
    opt.lr, opt.momentum = 0.1, 0.0
    opt.update()              # v = 0 * -1 - 0.1 = -0.1, w = -1.1
    numpy.testing.assert_allclose(link.w.array, [-1.1], atol=1e-15)


def test_state_follows_param_dtype():
    link = Holder(w=numpy.zeros((2, 3), numpy.float32))
    opt = optimizers.MomentumSGD().setup(link)
    link.w.grad = numpy.ones((2, 3), numpy.float32)
    opt.update()
    v = link.w.update_rule.state['v']
    assert v.dtype == numpy.float32 and v.shape == (2, 3)


def test_bad_momentum():
    with pytest.raises(ValueError, match='MomentumSGD: momentum'):
        optimizers.MomentumSGD(momentum=1.5)


def test_weight_decay_rate_gives_the_hooks_numbers_bit_for_bit():
    # The rule's decay and the WeightDecay hook round the same operations
    # in the same order: a script may use either (the bodies; no kernel).
    rng = numpy.random.default_rng(0)
    w0 = rng.standard_normal((5, 7)).astype(numpy.float32)
    grads = [rng.standard_normal((5, 7)).astype(numpy.float32)
             for _ in range(3)]
    results = []
    for in_rule in (True, False):
        link = Holder(w=w0.copy())
        if in_rule:
            opt = optimizers.MomentumSGD(lr=0.3, momentum=0.8,
                                         weight_decay_rate=0.01)
        else:
            opt = optimizers.MomentumSGD(lr=0.3, momentum=0.8)
        opt.setup(link)
        if not in_rule:
            opt.add_hook(optimizer_hooks.WeightDecay(0.01))
        with minichain.using_config('use_kernels', False):
            for g in grads:
                link.w.grad = g.copy()
                opt.update()
        results.append(link.w.array)
    numpy.testing.assert_array_equal(results[0], results[1])
    assert not numpy.array_equal(results[0], w0)


def test_weight_decay_by_hand():
    link = Holder(w=[2.0])
    opt = optimizers.MomentumSGD(lr=0.1, momentum=0.5,
                                 weight_decay_rate=0.5).setup(link)
    link.w.grad = numpy.array([1.0])
    opt.update()   # v = -0.1 * (1 + 0.5 * 2) = -0.2; w = 1.8
    numpy.testing.assert_allclose(link.w.array, [1.8], atol=1e-15)
    assert opt.weight_decay_rate == 0.5


def test_bad_weight_decay_rate():
    with pytest.raises(ValueError, match='MomentumSGD: weight_decay_rate'):
        optimizers.MomentumSGD(weight_decay_rate=-1e-4)
