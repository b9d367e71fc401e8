"""RMSprop: two hand-computed steps."""
import math

import numpy
import pytest

from minichain import optimizers
from tests._holder import Holder


def test_two_steps_by_hand():
    link = Holder(w=[1.0, 2.0])
    opt = optimizers.RMSprop(lr=0.1, alpha=0.9, eps=0).setup(link)
    link.w.grad = numpy.array([0.5, -1.0])
    opt.update()
    # ms = 0.1 * g^2 = [0.025, 0.1]; step = 0.1 * g / sqrt(ms)
    #    = 0.1 * [0.5 / 0.1581139, -1 / 0.3162278] = [0.3162278, -0.3162278]
    ms = link.w.update_rule.state['ms']
    numpy.testing.assert_allclose(ms, [0.025, 0.1], rtol=1e-14)
    numpy.testing.assert_allclose(
        link.w.array, [1 - 0.3162278, 2 + 0.3162278], rtol=1e-7)
    link.w.grad = numpy.array([0.0, 2.0])
    opt.update()
    # ms = 0.9 * [0.025, 0.1] + 0.1 * [0, 4] = [0.0225, 0.49]
    # step = 0.1 * [0, 2] / [sqrt(0.0225), 0.7] = [0, 0.2857143]
    numpy.testing.assert_allclose(ms, [0.0225, 0.49], rtol=1e-14)
    expected = [1 - 0.3162278, 2 + 0.3162278 - 0.2 / 0.7]
    numpy.testing.assert_allclose(link.w.array, expected, rtol=1e-7)
    assert math.isclose(opt.lr, 0.1)


def test_eps_guards_zero_gradient():
    link = Holder(w=[3.0])
    opt = optimizers.RMSprop(lr=0.1).setup(link)
    link.w.grad = numpy.array([0.0])
    opt.update()
    numpy.testing.assert_array_equal(link.w.array, [3.0])


def test_bad_alpha():
    with pytest.raises(ValueError, match='RMSprop: alpha'):
        optimizers.RMSprop(alpha=-0.1)
