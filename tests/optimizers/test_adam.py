"""Adam: hand-computed steps with bias correction, lr, weight decay."""
import math

import numpy
import pytest

from minichain import optimizers
from tests._holder import Holder


def test_first_step_moves_by_alpha():
    link = Holder(w=[1.0, 2.0])
    opt = optimizers.Adam(alpha=0.1, beta1=0.9, beta2=0.999, eps=1e-8).setup(
        link)
    link.w.grad = numpy.array([0.5, -1.0])
    opt.update()
    # m = 0.1 g = [0.05, -0.1]; v = 0.001 g^2 = [0.00025, 0.001]
    # lr_1 = 0.1 * sqrt(1 - 0.999) / (1 - 0.9) = sqrt(0.001) = 0.0316228
    # step = lr_1 * m / sqrt(v) = 0.0316228 * [3.162278, -3.162278] = ±0.1
    state = link.w.update_rule.state
    numpy.testing.assert_allclose(state['m'], [0.05, -0.1], rtol=1e-14)
    numpy.testing.assert_allclose(state['v'], [0.00025, 0.001], rtol=1e-12)
    assert math.isclose(opt.lr, math.sqrt(0.001), rel_tol=1e-12)
    # (eps = 1e-8 next to sqrt(v) ~ 0.03 changes the step by ~3e-7)
    numpy.testing.assert_allclose(link.w.array, [0.9, 2.1], rtol=1e-7)


def test_second_step_by_hand():
    link = Holder(w=[1.0, 2.0])
    opt = optimizers.Adam(alpha=0.1, beta1=0.9, beta2=0.999, eps=0).setup(
        link)
    link.w.grad = numpy.array([0.5, -1.0])
    opt.update()
    link.w.grad = numpy.array([1.0, 1.0])
    opt.update()
    # m = 0.9 [0.05, -0.1] + 0.1 [1, 1]          = [0.145, 0.01]
    # v = 0.999 [0.00025, 0.001] + 0.001 [1, 1]  = [0.00124975, 0.001999]
    # lr_2 = 0.1 sqrt(1 - 0.999^2) / (1 - 0.9^2) = 0.1 sqrt(0.001999) / 0.19
    m = numpy.array([0.145, 0.01])
    v = numpy.array([0.00124975, 0.001999])
    lr2 = 0.1 * math.sqrt(0.001999) / 0.19
    assert math.isclose(opt.lr, lr2, rel_tol=1e-12)
    expected = numpy.array([0.9, 2.1]) - lr2 * m / numpy.sqrt(v)
    numpy.testing.assert_allclose(link.w.array, expected, rtol=1e-12)
    # by hand: lr2 = 0.0235317, steps = [0.0965182, 0.0052632 (= 0.1/19)]
    numpy.testing.assert_allclose(link.w.array, [0.8034818, 2.0947368],
                                  rtol=1e-7)


def test_weight_decay_rate_is_decoupled():
    link = Holder(w=[2.0])
    opt = optimizers.Adam(alpha=0.1, weight_decay_rate=0.01).setup(link)
    link.w.grad = numpy.array([3.0])
    opt.update()
    # Adam step 0.1 (first step), plus decay 0.01 * 2
    numpy.testing.assert_allclose(link.w.array, [2.0 - 0.1 - 0.02], rtol=1e-7)


def test_alpha_settable_lr_read_only():
    link = Holder(w=[1.0])
    opt = optimizers.Adam(alpha=0.2, eps=0).setup(link)
    assert math.isclose(opt.lr, 0.2 * math.sqrt(0.001) / 0.1)  # t = 1 rate
    opt.alpha = 0.4
    link.w.grad = numpy.array([1.0])
    opt.update()
    numpy.testing.assert_allclose(link.w.array, [0.6], rtol=1e-14)
    with pytest.raises(AttributeError, match='set Adam.alpha'):
        opt.lr = 0.1


def test_bias_correction_uses_each_params_own_count():
    link = Holder(a=[0.0], b=[0.0])
    opt = optimizers.Adam(alpha=0.1, eps=0).setup(link)
    link.a.grad = numpy.array([1.0])
    opt.update()                   # b has no gradient: skipped
    link.b.grad = numpy.array([1.0])
    opt.update()
    assert (link.a.update_rule.t, link.b.update_rule.t, opt.t) == (2, 1, 2)
    # b's first step is a full first step of size alpha
    numpy.testing.assert_allclose(link.b.array, [-0.1], rtol=1e-14)


@pytest.mark.parametrize('kwargs', [{'beta1': 1.0}, {'beta2': -0.5},
                                    {'eps': -1e-8}])
def test_bad_hyperparameters(kwargs):
    with pytest.raises(ValueError, match='Adam: '):
        optimizers.Adam(**kwargs)
