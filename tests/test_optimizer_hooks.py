"""WeightDecay and GradientClipping: values worked out by hand."""
import math

import numpy
import pytest

from minichain import functions as F, optimizer_hooks, optimizers
from tests._holder import Holder


def test_weight_decay_adds_rate_times_param():
    link = Holder(a=[1.0, -2.0], b=[4.0])
    opt = optimizers.SGD(lr=0.5).setup(link)
    opt.add_hook(optimizer_hooks.WeightDecay(0.1))
    assert 'WeightDecay' in opt._pre_hooks
    link.a.grad = numpy.array([0.5, 0.5])
    opt.call_hooks('pre')
    # g + 0.1 * p = [0.5 + 0.1, 0.5 - 0.2]; b has no gradient: untouched
    numpy.testing.assert_allclose(link.a.grad, [0.6, 0.3], atol=1e-15)
    assert link.b.grad is None
    link.a.grad = numpy.array([0.5, 0.5])
    opt.update()
    # a - 0.5 * [0.6, 0.3] = [0.7, -2.15]
    numpy.testing.assert_allclose(link.a.array, [0.7, -2.15], atol=1e-15)
    numpy.testing.assert_array_equal(link.b.array, [4.0])


def test_weight_decay_with_shared_read_only_gradients():
    # F.sum(a + b) hands a and b one read-only broadcast gradient array;
    # the hook must not write into it (or a's decay would leak into b).
    link = Holder(a=[1.0], b=[10.0])
    opt = optimizers.SGD(lr=1.0).setup(link)
    opt.add_hook(optimizer_hooks.WeightDecay(0.5))
    F.sum(link.a + link.b).backward()
    opt.update()
    # a: 1 - (1 + 0.5 * 1) = -0.5;  b: 10 - (1 + 0.5 * 10) = 4
    numpy.testing.assert_allclose(link.a.array, [-0.5])
    numpy.testing.assert_allclose(link.b.array, [4.0])


def test_gradient_clipping_scales_by_global_norm():
    link = Holder(a=[0.0, 0.0], b=[0.0], c=[0.0])
    opt = optimizers.SGD(lr=1.0).setup(link)
    opt.add_hook(optimizer_hooks.GradientClipping(2.5))
    link.a.grad = numpy.array([3.0, 0.0])
    link.b.grad = numpy.array([4.0])   # global norm sqrt(9 + 16) = 5
    opt.call_hooks('pre')
    rate = 2.5 / (5 + 1e-6)            # ~ 0.5
    numpy.testing.assert_allclose(link.a.grad, [3 * rate, 0], rtol=1e-15)
    numpy.testing.assert_allclose(link.b.grad, [4 * rate], rtol=1e-15)
    norm = math.sqrt(float(link.a.grad @ link.a.grad + link.b.grad[0] ** 2))
    assert abs(norm - 2.5) < 1e-5 and norm <= 2.5
    assert link.c.grad is None


class _Shard:
    """A target standing for one rank's shard (as a sharded multi-node
    optimizer's): the other ranks' squared norm is added by
    ``sum_over_shards``."""

    def __init__(self, params, others):
        self.own, self.others, self.calls = params, others, 0

    def params(self, include_uninit=True):
        return iter(self.own)

    def sum_over_shards(self, value):
        self.calls += 1
        return float(value) + self.others


def test_gradient_clipping_sums_the_norm_over_shards():
    link = Holder(a=[0.0, 0.0])
    opt = optimizers.SGD(lr=1.0).setup(link)
    link.a.grad = numpy.array([3.0, 0.0])
    opt.target = _Shard([link.a], others=16.0)   # global norm 5, not 3
    optimizer_hooks.GradientClipping(2.5)(opt)
    numpy.testing.assert_allclose(link.a.grad, [3 * 2.5 / (5 + 1e-6), 0],
                                  rtol=1e-15)
    # a rank whose shard holds no gradient still joins the sum
    empty = _Shard([], others=25.0)
    opt.target = empty
    optimizer_hooks.GradientClipping(2.5)(opt)
    assert empty.calls == 1


def test_the_elementwise_rules_say_so():
    from minichain.optimizer import UpdateRule
    assert UpdateRule.elementwise is False
    for opt in (optimizers.SGD(), optimizers.MomentumSGD(),
                optimizers.Adam(), optimizers.RMSprop()):
        assert opt.create_update_rule().elementwise is True


def test_gradient_clipping_leaves_small_gradients_alone():
    link = Holder(a=numpy.array([0.3, 0.4], numpy.float32))
    opt = optimizers.SGD(lr=1.0).setup(link)
    opt.add_hook(optimizer_hooks.GradientClipping(1.0))
    g = numpy.array([0.3, 0.4], numpy.float32)  # norm 0.5 < 1
    link.a.grad = g
    opt.update()
    numpy.testing.assert_array_equal(link.a.array, [0, 0])
    assert link.a.grad.dtype == numpy.float32


def test_gradient_clipping_on_read_only_gradient_keeps_dtype():
    link = Holder(a=numpy.zeros(4, numpy.float32))
    opt = optimizers.SGD(lr=1.0).setup(link)
    opt.add_hook(optimizer_hooks.GradientClipping(1.0))
    F.sum(link.a).backward()           # grad: ones, norm 2, read-only view
    opt.update()
    assert link.a.dtype == numpy.float32
    numpy.testing.assert_allclose(link.a.array, [-0.5] * 4, rtol=1e-6)


def test_hooks_together_run_in_registration_order():
    link = Holder(a=[2.0])
    opt = optimizers.SGD(lr=1.0).setup(link)
    opt.add_hook(optimizer_hooks.WeightDecay(1.0))
    opt.add_hook(optimizer_hooks.GradientClipping(1.0))
    link.a.grad = numpy.array([1.0])   # decay: 1 + 2 = 3, then clip to ~1
    opt.update()
    numpy.testing.assert_allclose(link.a.array, [2.0 - 3 / (3 + 1e-6)])


@pytest.mark.parametrize('make, match', [
    (lambda: optimizer_hooks.WeightDecay(-1.0), 'WeightDecay: rate'),
    (lambda: optimizer_hooks.GradientClipping(0.0), 'GradientClipping: '),
    (lambda: optimizer_hooks.GradientClipping(float('inf')),
     'GradientClipping: threshold'),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize('name, arg', [('WeightDecay', 0.1),
                                       ('GradientClipping', 2.5)])
def test_chainer_v3_paths_of_the_hooks_warn_and_do_the_same(name, arg):
    # chainer.optimizer.WeightDecay (Chainer v7.8.1: a subclass of the
    # optimizer_hooks one that warns DeprecationWarning, naming the new path)
    from minichain import optimizer
    old = getattr(optimizer, name)
    assert old is getattr(optimizer, name)  # made once
    assert issubclass(old, getattr(optimizer_hooks, name))
    with pytest.warns(DeprecationWarning, match='use minichain.optimizer_'
                      'hooks.{}'.format(name)):
        hook = old(arg)
    params = []
    for h in (hook, getattr(optimizer_hooks, name)(arg)):
        link = Holder(a=[1.0, -2.0])
        opt = optimizers.SGD(lr=0.5).setup(link)
        opt.add_hook(h)
        assert name in opt._pre_hooks  # the name of the new one
        link.a.grad = numpy.array([3.0, 4.0])
        opt.update()
        params.append(link.a.array)
    numpy.testing.assert_array_equal(*params)
    with pytest.raises(AttributeError, match="no attribute 'Lasso'"):
        optimizer.Lasso
