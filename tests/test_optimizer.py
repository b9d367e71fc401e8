"""Optimizer machinery: setup, update paths, counters, hooks, rules."""
import copy

import numpy
import pytest

import minichain
from minichain import backend, functions as F, links as L, optimizers
from minichain.optimizer import Hyperparameter
from tests._holder import Holder


ALL = [lambda: optimizers.SGD(lr=0.1),
       lambda: optimizers.MomentumSGD(lr=0.1),
       lambda: optimizers.Adam(alpha=0.1),
       lambda: optimizers.RMSprop(lr=0.1)]


def test_setup_returns_optimizer_and_gives_every_param_a_rule():
    model = L.Linear(None, 2)  # W not initialized yet
    opt = optimizers.MomentumSGD()
    assert opt.setup(model) is opt and opt.target is model
    assert model.W.update_rule is not None and model.b.update_rule is not None
    assert model.W.update_rule is not model.b.update_rule
    assert isinstance(opt, minichain.Optimizer)


def test_setup_rejects_non_links_and_update_needs_setup():
    with pytest.raises(TypeError, match='SGD.setup: expected a Link'):
        optimizers.SGD().setup([1, 2])
    with pytest.raises(RuntimeError, match='call setup'):
        optimizers.SGD().update()


def test_counters():
    link = Holder(w=[1.0])
    opt = optimizers.SGD().setup(link)
    for _ in range(3):
        opt.update()  # no gradient: t still counts the calls
    assert opt.t == 3 and link.w.update_rule.t == 0
    assert opt.epoch == 0
    opt.new_epoch()
    opt.new_epoch()
    assert opt.epoch == 2


def test_update_with_lossfun_clears_grads_and_steps():
    link = Holder(w=[1.0, -2.0])
    opt = optimizers.SGD(lr=0.25).setup(link)
    link.w.grad = numpy.array([100.0, 100.0])  # stale: must be cleared
    seen = {}

    def lossfun(x, scale=1.0):
        seen['args'] = (x, scale)
        return F.sum(link.w * link.w) * scale   # grad = 2 * scale * w

    opt.update(lossfun, 'batch', scale=0.5)
    assert seen['args'] == ('batch', 0.5)
    # w - 0.25 * (w) = 0.75 w
    numpy.testing.assert_allclose(link.w.array, [0.75, -1.5], atol=1e-15)
    numpy.testing.assert_allclose(link.w.grad, [1.0, -2.0], atol=1e-15)
    assert opt.t == 1


def test_update_ignores_args_without_lossfun():
    # a data-parallel wrapper calls update(None, *args) after its allreduce
    link = Holder(w=[1.0])
    opt = optimizers.SGD(lr=1.0).setup(link)
    link.w.grad = numpy.array([0.5])
    opt.update(None, 'ignored')
    numpy.testing.assert_allclose(link.w.array, [0.5])


@pytest.mark.parametrize('make', ALL)
def test_params_without_grad_are_skipped(make):
    link = Holder(a=[1.0, 2.0], b=[3.0])
    opt = make().setup(link)
    link.a.grad = numpy.array([1.0, 1.0])
    opt.update()
    numpy.testing.assert_array_equal(link.b.array, [3.0])
    assert link.b.update_rule.state is None and link.b.update_rule.t == 0
    assert not numpy.array_equal(link.a.array, [1.0, 2.0])


@pytest.mark.parametrize('make', ALL)
def test_shared_and_read_only_gradients_are_not_written(make):
    # F.sum(a + b) gives a and b the SAME read-only broadcast gradient.
    link = Holder(a=[1.0, 2.0], b=[3.0, 4.0])
    opt = make().setup(link)
    F.sum(link.a + link.b).backward()
    assert link.a.grad is link.b.grad and not link.a.grad.flags.writeable
    opt.update()
    numpy.testing.assert_array_equal(link.a.grad, [1.0, 1.0])
    # both parameters received the same step
    numpy.testing.assert_allclose(link.b.array - link.a.array, [2.0, 2.0])


def test_lazily_initialized_params_are_updated():
    model = L.Linear(None, 2)
    opt = optimizers.SGD(lr=0.1).setup(model)
    x = numpy.ones((3, 4), numpy.float32)
    opt.update(lambda: F.sum(model(x)))
    # dL/db = batch size = 3 for each output, so b = 0 - 0.1 * 3
    assert model.W.shape == (2, 4) and model.W.update_rule.t == 1
    numpy.testing.assert_allclose(model.b.array, [-0.3, -0.3], rtol=1e-6)


def test_per_parameter_override_and_disable():
    link = Holder(a=[1.0], b=[1.0], c=[1.0])
    opt = optimizers.SGD(lr=0.5).setup(link)
    link.a.update_rule.hyperparam.lr = 0.0     # frozen by override
    link.b.update_rule.enabled = False          # frozen by switch
    for p in link.params():
        p.grad = numpy.array([1.0])
    opt.update()
    assert [float(p.array[0]) for p in link.params()] == [1.0, 1.0, 0.5]
    opt.lr = 0.25  # the override still wins for a
    opt.update()
    assert [float(p.array[0]) for p in link.params()] == [1.0, 1.0, 0.25]


def test_params_added_after_setup_get_a_rule():
    link = Holder(a=[1.0])
    opt = optimizers.MomentumSGD(lr=1.0, momentum=0.0).setup(link)
    with link.init_scope():
        link.z = minichain.Parameter(numpy.array([5.0]))
    link.z.grad = numpy.array([1.0])
    opt.update()
    numpy.testing.assert_array_equal(link.z.array, [4.0])


def test_workspace_is_reused_across_steps():
    link = Holder(a=numpy.ones((4, 5), numpy.float32),
                  b=numpy.ones(3, numpy.float32))
    opt = optimizers.Adam().setup(link)
    for p in link.params():
        p.grad = numpy.ones_like(p.array)
    opt.update()
    buffers = {k: id(v) for k, v in opt._workspace._buffers.items()}
    opt.update()
    assert {k: id(v) for k, v in opt._workspace._buffers.items()} == buffers
    assert all(v.size == 20 for v in opt._workspace._buffers.values())


def test_hooks_run_in_order_with_timing():
    link = Holder(w=[1.0])
    opt = optimizers.SGD(lr=1.0).setup(link)
    log = []

    def pre1(o):
        log.append(('pre1', float(link.w.array[0])))

    class Post:
        name = 'after'

        def __call__(self, o):
            log.append(('post', float(link.w.array[0]), o.t))

    opt.add_hook(pre1)
    opt.add_hook(lambda o: log.append(('pre2',)), name='second')
    opt.add_hook(Post(), timing='post')
    link.w.grad = numpy.array([1.0])
    opt.update()
    assert log == [('pre1', 1.0), ('pre2',), ('post', 0.0, 1)]
    with pytest.raises(KeyError, match="'after' already exists"):
        opt.add_hook(Post())
    opt.remove_hook('pre1')
    opt.remove_hook('after')
    log.clear()
    opt.update()
    assert log == [('pre2',)]
    with pytest.raises(KeyError, match='no hook named'):
        opt.remove_hook('pre1')
    with pytest.raises(ValueError, match="timing must be 'pre' or 'post'"):
        opt.add_hook(pre1, timing='later')
    with pytest.raises(TypeError, match='must be callable'):
        opt.add_hook(3)


def test_hyperparameter_falls_back_to_parent():
    parent = Hyperparameter()
    parent.lr, parent.momentum = 0.1, 0.9
    child = Hyperparameter(parent)
    child.lr = 0.5
    assert (child.lr, child.momentum) == (0.5, 0.9)
    assert child.get_dict() == {'lr': 0.5, 'momentum': 0.9}
    with pytest.raises(AttributeError, match="'eps' is not defined"):
        child.eps


_HYPERPARAMETERS = [(optimizers.SGD, 'lr'), (optimizers.MomentumSGD, 'lr'),
                    (optimizers.MomentumSGD, 'momentum'),
                    (optimizers.MomentumSGD, 'weight_decay_rate'),
                    (optimizers.Adam, 'alpha'), (optimizers.Adam, 'beta1'),
                    (optimizers.Adam, 'beta2'), (optimizers.Adam, 'eps'),
                    (optimizers.Adam, 'weight_decay_rate'),
                    (optimizers.RMSprop, 'lr'), (optimizers.RMSprop, 'alpha'),
                    (optimizers.RMSprop, 'eps')]


@pytest.mark.parametrize('cls,name', _HYPERPARAMETERS)
def test_hyperparameters_are_checked_whenever_they_are_set(cls, name):
    """Set after construction (on the optimizer, its hyperparam, or one
    parameter's rule), a bad value is refused as the constructor refuses
    it, naming the optimizer, the hyper-parameter and the value, and the
    old value stays."""
    opt = cls().setup(Holder(w=[1.0]))
    rule = opt.target.w.update_rule
    good = getattr(opt, name)
    low, high, _ = getattr(cls, name).limits
    bad = [float('nan'), float('inf'), -float('inf'), low - 0.1, '0.1',
           None] + ([] if high is None else [high + 0.5])
    for value in bad:
        with pytest.raises((TypeError, ValueError)) as ctor:
            cls(**{name: value})
        for where in (opt, opt.hyperparam, rule.hyperparam):
            with pytest.raises((TypeError, ValueError)) as e:
                setattr(where, name, value)
            assert str(e.value) == str(ctor.value)
            assert str(e.value).startswith('{}: {} must be '.format(
                cls.__name__, name))
            assert repr(value) in str(e.value) or str(value) in str(e.value)
        assert getattr(opt, name) == good == getattr(rule.hyperparam, name)
    rule.hyperparam.__setattr__(name, good / 2)   # a good one is taken
    assert getattr(rule.hyperparam, name) == good / 2


def test_deepcopy_of_a_trained_model_keeps_working_rules():
    link = Holder(w=[1.0])
    opt = optimizers.MomentumSGD(lr=1.0, momentum=0.5).setup(link)
    link.w.grad = numpy.array([1.0])
    opt.update()
    twin = copy.deepcopy(link)
    rule = twin.w.update_rule
    assert rule is not link.w.update_rule
    assert rule.hyperparam.lr == 1.0 and rule.state['v'][0] == -1.0


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('make', ALL)
def test_gpu_matches_cpu(make):
    rng = numpy.random.default_rng(0)
    w0 = rng.standard_normal((3, 4)).astype(numpy.float32)
    grads = [rng.standard_normal((3, 4)).astype(numpy.float32)
             for _ in range(3)]
    results = []
    for on_gpu in (False, True):
        link = Holder(w=w0.copy())
        if on_gpu:
            link.to_gpu()
        opt = make().setup(link)
        for g in grads:
            link.w.grad = backend.to_gpu(g) if on_gpu else g
            opt.update()
        for state in link.w.update_rule.state.values():
            assert backend.get_device_id(state) == backend.get_device_id(
                link.w.array)
        results.append(backend.to_cpu(link.w.array))
    numpy.testing.assert_allclose(results[0], results[1], rtol=1e-5,
                                  atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float16])
def test_gpu_momentum_step_in_one_launch_equals_the_rules(dtype):
    # MomentumSGD.update with the kernels (the whole step in one launch,
    # its state made at the first step inside it) and without them, from
    # the same start: the same bytes, a parameter with its own lr and an
    # empty one included.
    from minichain.configuration import using_config
    rng = numpy.random.default_rng(1)
    shapes = {'a': (3, 4), 'b': (5,), 'c': (0,)}
    start = {k: rng.standard_normal(s).astype(dtype)
             for k, s in shapes.items()}
    grads = [{k: rng.standard_normal(s).astype(dtype)
              for k, s in shapes.items()} for _ in range(3)]
    results = []
    for use in (True, False):
        link = Holder(**{k: v.copy() for k, v in start.items()})
        link.to_gpu()
        opt = optimizers.MomentumSGD(lr=0.1, momentum=0.9).setup(link)
        link.b.update_rule.hyperparam.lr = 0.01
        with using_config('use_kernels', use):
            for step in grads:
                for k, g in step.items():
                    getattr(link, k).grad = backend.to_gpu(g)
                opt.update()
        results.append({k: backend.to_cpu(getattr(link, k).array)
                        for k in shapes})
    for k in shapes:
        assert results[0][k].tobytes() == results[1][k].tobytes(), k


# -- loss scaling (Chainer v7's optimizer.loss_scaling) -----------------------
class _Square(minichain.Link):
    """loss = sum(w * w * k) / 2: the gradient is w * k."""

    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.w = minichain.Parameter(numpy.array([1.0, -2.0],
                                                     numpy.float32))

    def loss(self, k=1.0):
        return minichain.functions.sum(self.w * self.w * k) * 0.5


def _scaled(**kwargs):
    link = _Square()
    opt = optimizers.SGD(lr=0.5).setup(link)
    opt.loss_scaling(**kwargs)
    return link, opt


def test_a_static_loss_scale_steps_as_without_one():
    link, opt = _scaled(scale=1024.0)
    opt.update(link.loss)
    assert opt.loss_scale == 1024.0
    numpy.testing.assert_array_equal(link.w.array, [0.5, -1.0])
    numpy.testing.assert_array_equal(link.w.grad, [1.0, -2.0])  # unscaled


def test_dynamic_scaling_doubles_then_halves_and_skips_then_grows():
    link, opt = _scaled(interval=4)
    assert opt.dynamic_loss_scaling and opt.loss_scale == 1.0
    opt.update(link.loss)
    opt.update(link.loss)
    assert opt.loss_scale == 4.0            # doubles before any overflow
    before = link.w.array.copy()
    with pytest.warns(RuntimeWarning, match=r'update 3 skipped: the '
                      r'gradient of /w holds inf or NaN at loss scale 4.0'):
        opt.update(link.loss, numpy.float32(numpy.inf))
    numpy.testing.assert_array_equal(link.w.array, before)   # skipped
    assert opt.t == 3 and link.w.update_rule.t == 2
    assert opt.loss_scale == 2.0            # halved
    for _ in range(4):                      # then doubles over 4 updates
        opt.update(link.loss)
    assert opt.loss_scale == pytest.approx(4.0)


def test_the_dynamic_scale_stays_within_1_and_65504():
    link, opt = _scaled()
    for _ in range(20):
        opt.update(link.loss, 0.0)
    assert opt.loss_scale == 65504.0
    link, opt = _scaled()
    with pytest.warns(RuntimeWarning):
        opt.update(link.loss, numpy.float32(numpy.nan))
    assert opt.loss_scale == 1.0


def test_loss_scaling_arguments_are_checked():
    opt = optimizers.SGD()
    with pytest.raises(ValueError, match='SGD.loss_scaling: interval must '
                       'be >= 1, got 0'):
        opt.loss_scaling(interval=0)
    with pytest.raises(ValueError, match='scale must be a positive number, '
                       'got -1'):
        opt.set_loss_scale(-1)
