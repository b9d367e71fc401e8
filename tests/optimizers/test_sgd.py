"""SGD: hand-computed steps, lr changes, dtype and gradient-free params."""
import numpy
import pytest

from minichain import optimizers
from tests._holder import Holder


def test_one_step_by_hand():
    link = Holder(w=[1.0, 2.0])
    opt = optimizers.SGD(lr=0.1).setup(link)
    link.w.grad = numpy.array([0.5, -1.0])
    opt.update()
    # w - lr * g = [1 - 0.05, 2 + 0.1]
    numpy.testing.assert_allclose(link.w.array, [0.95, 2.1], atol=1e-15)
    assert opt.t == 1 and link.w.update_rule.t == 1


def test_lr_change_between_steps():
    link = Holder(w=[1.0, 2.0])
    opt = optimizers.SGD(lr=0.1).setup(link)
    link.w.grad = numpy.array([0.5, -1.0])
    opt.update()
    opt.lr = 0.01
    assert opt.lr == 0.01 and link.w.update_rule.hyperparam.lr == 0.01
    opt.update()  # same gradient: [0.95 - 0.005, 2.1 + 0.01]
    numpy.testing.assert_allclose(link.w.array, [0.945, 2.11], atol=1e-15)
    assert opt.t == 2


def test_keeps_float32_and_skips_params_without_grad():
    link = Holder(w=numpy.ones(3, numpy.float32),
                  u=numpy.ones(2, numpy.float32))
    opt = optimizers.SGD(lr=0.5).setup(link)
    link.w.grad = numpy.full(3, 2, numpy.float32)
    opt.update()
    assert link.w.dtype == numpy.float32
    numpy.testing.assert_array_equal(link.w.array, [0, 0, 0])
    numpy.testing.assert_array_equal(link.u.array, [1, 1])
    assert link.u.update_rule.t == 0


@pytest.mark.parametrize('lr, error', [(-0.1, ValueError), ('0.1', TypeError),
                                       (float('nan'), ValueError)])
def test_bad_lr(lr, error):
    with pytest.raises(error, match='SGD: lr'):
        optimizers.SGD(lr=lr)
