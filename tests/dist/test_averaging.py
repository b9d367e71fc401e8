"""The averaging interface under the multi-node optimizer, without MPI.

The optimizer talks to its averaging only through ``setup``, ``prepare``,
``average``, ``stepped`` and ``discard`` (minichain/dist/averaging/base.py),
and the wrappers (accumulate, the NaN check, join) only through the same
methods: a recording averaging stands in for the communicator here. The
numbers themselves are checked on real ranks (tests/dist/workers/
checks_overlap.py, checks_generic.py).
"""
import numpy
import pytest

import minichain
from minichain import backend
from minichain import functions as F
from minichain import links as L
from minichain.dist.averaging.accumulate import Accumulate
from minichain.dist.averaging.base import Averaging
from minichain.dist.averaging.finite import (CheckFinite,
                                             NonFiniteGradientError)
from minichain.dist.averaging.join import Join, join
from minichain.dist.optimizers import MultiNodeOptimizer


class Recording(Averaging):
    """Logs every call; ``average`` returns the next of ``counts`` (then
    1)."""

    def __init__(self, log, passes=1, counts=()):
        self.log, self.passes, self.counts = log, passes, list(counts)

    def setup(self, model):
        self.log.append('setup')

    def prepare(self, final=True):
        self.log.append('prepare {}'.format(final))

    def average(self, model, has_data=None):
        self.log.append('average' if has_data is None
                        else 'average has_data={}'.format(has_data))
        return self.counts.pop(0) if self.counts else 1

    def stepped(self, model):
        self.log.append('stepped')

    def discard(self):
        self.log.append('discard')


class OneRank:
    """What the optimizer and the NaN check ask of a communicator here: the
    broadcast, the culprits, the watched wait (logged in ``waits``, with
    the log's length then)."""
    size = 1

    def __init__(self, log):
        self.log, self.waits = log, []

    def bcast_data(self, model):
        self.log.append('bcast')

    def allgather_obj(self, obj):
        return [obj]

    def wait_until(self, done, what, on_stall=None):
        self.waits.append((what, len(self.log)))
        while not done():
            pass


def _model():
    with minichain.using_config('dtype', 'float64'):
        model = minichain.Sequential(L.Linear(3, 2))
    model(numpy.zeros((1, 3)))
    return model


def _optimizer(log, averaging, actual=None):
    model = _model()
    opt = MultiNodeOptimizer(actual or minichain.optimizers.SGD(lr=0.1),
                             OneRank(log), averaging).setup(model)
    x = numpy.ones((2, 3))

    def loss():
        return F.sum(model(x))
    loss.x = x
    return model, opt, loss


def test_the_optimizer_averages_then_steps_through_the_interface():
    log = []
    model, opt, loss = _optimizer(log, Recording(log))
    assert log == ['setup', 'prepare True']
    del log[:]
    opt.update(loss)  # the first update broadcasts instead
    assert log == ['discard', 'bcast', 'prepare True'] and opt.t == 0
    del log[:]
    opt.update(loss)
    assert log == ['average', 'stepped', 'prepare True'] and opt.t == 1


def test_no_step_when_the_averaging_returns_zero():
    log = []
    model, opt, loss = _optimizer(log, Recording(log, counts=[0]))
    opt.update(loss)
    before = model[0].W.array.copy()
    opt.update(loss)
    assert opt.t == 0 and 'stepped' not in log
    assert (model[0].W.array == before).all()


def test_accumulate_averages_every_kth_pass_and_arms_only_the_last():
    log = []
    acc = Accumulate(Recording(log, passes=3))
    model, opt, loss = _optimizer(log, acc)
    opt.update(loss)
    del log[:]
    cleared = []
    for _ in range(6):
        cleared.append(acc.starts_step)
        opt.update(loss)
    assert [e for e in log if e.startswith('average')] == ['average'] * 2
    # After passes 1, 2, 3 of each step (before the next): only the pass
    # after the second is final.
    assert [e for e in log if e.startswith('prepare')] == [
        'prepare False', 'prepare True', 'prepare False'] * 2
    assert cleared == [True, False, False] * 2 and opt.t == 2


def test_accumulated_gradients_are_summed_until_the_step():
    log = []
    model, opt, loss = _optimizer(log, Accumulate(Recording(log, passes=2)))
    opt.update(loss)
    opt.update(loss)
    one = model[0].W.grad.copy()
    opt.update(loss)  # the second pass adds to the first
    numpy.testing.assert_array_equal(model[0].W.grad, 2 * one)
    opt.update(loss)  # a new step starts from cleared gradients
    numpy.testing.assert_array_equal(model[0].W.grad, one)


def test_join_averages_after_backward_and_shadows_until_no_rank_has_data():
    log = []
    inner = Accumulate(Recording(log, passes=2, counts=[3, 2, 1, 0]))
    model, opt, loss = _optimizer(log, inner)
    with join(opt) as joined:
        assert isinstance(opt.averaging, Join)
        del log[:]
        for _ in range(2):  # one step with data
            joined.update(loss)
        assert log == ['prepare False', 'average has_data=True',
                       'stepped', 'prepare False']
        del log[:]
    # Out of data: three more steps (2, 1 ranks with data, then none),
    # two updates each, contributing nothing.
    assert log.count('average has_data=False') == 3
    assert log.count('stepped') == 2 and opt.t == 3
    assert opt.averaging is inner and log[-1] == 'prepare False'
    assert inner.starts_step
    del log[:]
    opt.update(loss)  # after join: overlap may send in the final pass again
    assert log == ['prepare True']


def test_join_refuses_what_cannot_shadow():
    class Stale(Recording):
        can_join = False
    log = []
    _, opt, _ = _optimizer(log, Stale(log))
    with pytest.raises(TypeError, match='without double buffering'):
        with join(opt):
            pass
    with pytest.raises(TypeError, match='got SGD'):
        with join(minichain.optimizers.SGD()):
            pass


def test_check_finite_raises_before_the_step_naming_the_parameters():
    log = []
    model, opt, loss = _optimizer(
        log, CheckFinite(Recording(log), OneRank(log), lambda: opt.t))
    opt.update(loss)
    loss.x[1, 2] = numpy.nan  # dL/dW = x summed: not finite; dL/db is
    with pytest.raises(NonFiniteGradientError) as e:
        opt.update(loss)
    assert e.value.update == 1 and e.value.ranks == [0]
    assert e.value.params == {0: ['/0/W']} and 'stepped' not in log
    assert opt.t == 0


def _deferred(log, gpu=False):
    """A MomentumSGD (state: v) under a NaN check read back after the
    step, as on the GPU (without ``gpu``, on NumPy arrays); the step logs
    'step'."""
    opt = None
    check = CheckFinite(Recording(log), OneRank(log), lambda: opt.t,
                        defer=None if gpu else True)
    model, opt, loss = _optimizer(log, check, minichain.optimizers.MomentumSGD(
        lr=0.1))
    if gpu:
        model.to_gpu(0)
        x = backend.to_gpu(loss.x)

        def loss():
            return F.sum(model(x))
        loss.x = x
    opt.add_hook(lambda o: log.append('step'), name='log', timing='post')
    opt.update(loss)  # the broadcast
    del log[:]
    return model, opt, loss, check.comm.waits


def _state(model):
    return [(backend.to_cpu(p.array), p.update_rule.t,
             None if p.update_rule.state is None
             else backend.to_cpu(p.update_rule.state['v']))
            for p in model.params()]


def test_on_the_gpu_the_flag_is_read_once_after_the_step_under_the_watchdog():
    """The check read the flag on the host right after the allreduce:
    outside the watchdog (a rank that never joined hung the others) and a
    wait for the whole queue before every step."""
    log = []
    model, opt, loss, waits = _deferred(log)
    for step in (1, 2):
        opt.update(loss)
        assert log == ['average', 'step', 'stepped', 'prepare True']
        # one watched wait per step, after the step was launched
        assert waits == [('the NaN check of the averaged gradients', 2)]
        del log[:], waits[:]
    assert opt.t == 2


@pytest.mark.parametrize('steps_before,gpu', [
    (0, False), (2, False),
    pytest.param(2, True, marks=[pytest.mark.gpu, pytest.mark.skipif(
        not backend.gpu_available(), reason='no CUDA GPU')])])
def test_on_the_gpu_a_step_on_inf_or_nan_is_undone(steps_before, gpu):
    """Read back after the step, the flag must undo it: the parameters,
    the momentum, the step counts (and no state where there was none)."""
    log = []
    model, opt, loss, waits = _deferred(log, gpu)
    for _ in range(steps_before):
        opt.update(loss)
    before, t = _state(model), opt.t
    del log[:]
    loss.x[1, 2] = numpy.inf
    with pytest.raises(NonFiniteGradientError) as e:
        opt.update(loss)
    assert e.value.update == t + 1 and e.value.params == {0: ['/0/W']}
    assert 'step' in log and 'stepped' not in log and opt.t == t
    assert waits[-1] == ('the NaN check of the averaged gradients', 2)
    for (a, rule_t, v), (a2, rule_t2, v2) in zip(before, _state(model)):
        assert (a == a2).all() and rule_t == rule_t2
        assert (v is v2 is None) or (v == v2).all()
    loss.x[1, 2] = 1.0  # a loop that goes on steps as if it never happened
    opt.update(loss)
    assert opt.t == t + 1 and all(p.update_rule.t == t + 1
                                  for p in model.params())


def test_after_an_error_the_next_pass_starts_a_step_and_is_prepared():
    # A loop may catch NonFiniteGradientError and go on: with accumulate
    # the next pass is the first of a new step, not a final one (else an
    # overlapped averaging would send its gradients as final).
    log = []
    opt = None
    inner = Accumulate(CheckFinite(Recording(log, passes=2), OneRank(log),
                                   lambda: opt.t))
    model, opt, loss = _optimizer(log, inner)
    opt.update(loss)
    opt.update(loss)
    loss.x[0, 0] = numpy.nan
    del log[:]
    with pytest.raises(NonFiniteGradientError):
        opt.update(loss)
    assert log == ['average', 'prepare False'] and inner.starts_step
