"""The oneDNN kernel of MomentumSGD's update
(minichain/kernels/onednn/optimizers.py) against the rule's body,
``MomentumSGDRule.update_core``, at every parameter shape of ResNet-50
(the main job's model), with and without weight decay.

Each case starts the kernel and the body from the same parameter,
gradient and velocity and compares one step. The bound comes from the
arithmetic: each side rounds each of the terms ``mu |v|``, ``lr |g|`` and
``lr wd |param|`` and their sums a few times (and the kernel's scales
``-lr`` and ``-lr wd`` once), so the new velocities differ by at most
8 units of roundoff of those terms' sum, and the parameters by that plus
two of ``|param| + |v|``. A wrong sign, scale or momentum is off by
orders of magnitude more.
"""
import numpy
import pytest

import minichain
from minichain import kernels, optimizer_hooks, optimizers
from minichain.kernels.onednn import _plan
from minichain.optimizers.momentum_sgd import MomentumSGDRule
from models.resnet import ResNet50
from tests._holder import Holder
from tests.kernels.test_onednn import onednn

F32 = numpy.float32
U = float(numpy.finfo(F32).eps) / 2
KERNEL = onednn.optimizers.momentum_sgd


@pytest.fixture(autouse=True)
def onednn_on():
    with minichain.using_config('use_onednn', 'auto'):
        yield


def _shapes():
    model = ResNet50(n_classes=10, stem='small2', in_channels=1)
    return sorted({p.shape for _, p in model.namedparams()})


def _case(shape, seed):
    rng = numpy.random.default_rng(seed)
    p, g, v = (rng.standard_normal(shape).astype(F32) for _ in range(3))
    return p, g * F32(0.01), v * F32(0.001)


def _one_step(p, g, v, lr, mu, wd, use_kernel):
    link = Holder(w=p.copy())
    optimizers.MomentumSGD(lr=lr, momentum=mu,
                           weight_decay_rate=wd).setup(link)
    rule = link.w.update_rule
    rule.init_state(link.w)
    rule.state['v'][...] = v
    link.w.grad = g.copy()
    if use_kernel:
        assert KERNEL(rule, link.w) is True
    else:
        rule.update_core(link.w)
    return link.w.array, rule.state['v']


@pytest.mark.parametrize('wd', [0, 1e-4])
def test_the_kernel_equals_the_body_at_every_resnet50_parameter(
        wd, monkeypatch):
    # every shape, also those it declines for speed (under _MIN_SIZE)
    monkeypatch.setattr(onednn.optimizers, '_MIN_SIZE', 0)
    mu = 0.9
    tested = 0
    shapes = _shapes()
    for i, shape in enumerate(shapes):
        p, g, v = _case(shape, i)
        for lr in (0.1, 0.0137):   # the rate changes between calls
            pk, vk = _one_step(p, g, v, lr, mu, wd, True)
            pb, vb = _one_step(p, g, v, lr, mu, wd, False)
            v_bound, p_bound = _bounds(p, g, v, lr, mu, wd, pb, vb)
            assert (abs(vk - vb) <= v_bound).all(), (shape, wd, lr)
            assert (abs(pk - pb) <= p_bound).all(), (shape, wd, lr)
            # a wrong term would be far off: the step itself is not small
            assert abs(pk - p).max() > 1e3 * p_bound.max()
            tested += 1
    assert tested == 2 * len(shapes) > 40


def test_without_weight_decay_the_kernel_does_not_read_the_parameter():
    # 0 * inf is NaN: a kernel that scaled the parameter by 0 would
    # turn an infinite parameter's velocity into NaN; the body does not.
    p, g, v = _case((512, 256), 0)
    p[0, 0] = numpy.inf
    pk, vk = _one_step(p, g, v, 0.1, 0.9, 0, True)
    pb, vb = _one_step(p, g, v, 0.1, 0.9, 0, False)
    assert numpy.isfinite(vk).all() and numpy.isfinite(vb).all()
    numpy.testing.assert_array_equal(pk, pb)


@pytest.mark.parametrize('what', ['float64', 'strided', 'small'])
def test_what_the_kernel_declines(what):
    shape = (512, 256) if what != 'small' else (64, 128)
    p, g, v = _case(shape, 1)
    link = Holder(w=p.astype(numpy.float64) if what == 'float64' else p)
    optimizers.MomentumSGD(lr=0.1).setup(link)
    rule = link.w.update_rule
    rule.init_state(link.w)
    grad = g.astype(link.w.array.dtype)
    if what == 'strided':
        grad = numpy.asfortranarray(grad)
    link.w.grad = grad
    assert KERNEL(rule, link.w) is None


def test_the_seam_runs_the_kernel_and_the_switch_turns_it_off(monkeypatch):
    calls = []
    registered = kernels.registered(MomentumSGDRule, 'onednn')
    assert registered.__wrapped__ is KERNEL

    def spy(rule, param):
        calls.append(param.shape)
        return KERNEL(rule, param)
    monkeypatch.setitem(kernels.registry, (MomentumSGDRule, 'onednn'),
                        onednn._gated(spy))
    p, g, _ = _case((512, 256), 2)
    results = []
    for mode in ('auto', 'never'):
        link = Holder(w=p.copy())
        opt = optimizers.MomentumSGD(lr=0.1, weight_decay_rate=1e-4)
        opt.setup(link)
        with minichain.using_config('use_onednn', mode):
            for _ in range(2):
                link.w.grad = g.copy()
                opt.update()
        results.append(link.w.array)
    assert calls == [(512, 256)] * 2   # 'never': the body ran
    numpy.testing.assert_allclose(results[0], results[1], rtol=1e-6,
                                  atol=1e-7)


def _bounds(p, g, v, lr, mu, wd, pb, vb):
    """The bounds above: 8 units of roundoff of the velocity's terms for
    v, two more of |param| + |v| for the parameter."""
    v_bound = 8 * U * (mu * abs(v) + lr * abs(g) + lr * wd * abs(p))
    return v_bound, v_bound + 2 * U * (abs(pb) + abs(vb))


def test_decay_in_the_rule_is_the_hooks_within_the_bound(monkeypatch):
    """models/README.md: decay in the rule gives the WeightDecay hook's
    numbers, bit for bit on NumPy and within the bound above on oneDNN
    (it rounds lr * wd once and fuses the adds): one step of each way
    from the same state, at every ResNet-50 parameter shape."""
    monkeypatch.setattr(onednn.optimizers, '_MIN_SIZE', 0)
    lr, mu, wd = 0.1, 0.9, 1e-4
    for i, shape in enumerate(_shapes()):
        p, g, v = _case(shape, i)
        pk, vk = _one_step(p, g, v, lr, mu, wd, True)   # in the rule
        link = Holder(w=p.copy())                        # the hook's way
        opt = optimizers.MomentumSGD(lr=lr, momentum=mu).setup(link)
        opt.add_hook(optimizer_hooks.WeightDecay(wd))
        opt.target.w.update_rule.init_state(link.w)
        opt.target.w.update_rule.state['v'][...] = v
        link.w.grad = g.copy()
        with minichain.using_config('use_onednn', 'never'):
            opt.update()
        vh = opt.target.w.update_rule.state['v']
        v_bound, p_bound = _bounds(p, g, v, lr, mu, wd, link.w.array, vh)
        assert (abs(vk - vh) <= v_bound).all(), shape
        assert (abs(pk - link.w.array) <= p_bound).all(), shape


def test_a_momentum_schedule_keeps_one_primitive_per_size():
    """The momentum is fixed in the first form's primitive: a schedule
    replaces it, and the cache keeps one per parameter size."""
    p, g, v = _case((512, 256), 3)

    def primitives():
        return [k for k in _plan._cache
                if k[0] == 'momentum_sgd' and k[1] == p.size]
    for mu in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.6):
        pk, vk = _one_step(p, g, v, 0.1, mu, 1e-4, True)
        pb, vb = _one_step(p, g, v, 0.1, mu, 1e-4, False)
        v_bound, p_bound = _bounds(p, g, v, 0.1, mu, 1e-4, pb, vb)
        assert (abs(vk - vb) <= v_bound).all(), mu   # this momentum's
        assert (abs(pk - pb) <= p_bound).all(), mu
        assert len(primitives()) == 1
