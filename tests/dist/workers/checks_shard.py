"""Checks of shard_state=True, run by every rank of one MPI job per rank
count (tests/dist/test_shard.py), each on the flat and the ring
communicator."""
import numpy

import minichain
from minichain import dist, optimizer_hooks, optimizers
from minichain import links as L
from minichain.configuration import using_config
from minichain.dist.testing import assert_data_parallel_equivalent
from minichain.optimizer import UpdateRule
from minichain.serializers.npz import DictionarySerializer, NpzDeserializer

import _models as M
from checks_model import _data, _expect_error, _equivalent

OPTIMIZERS = {'MomentumSGD': lambda: optimizers.MomentumSGD(lr=0.1),
              'Adam': lambda: optimizers.Adam(alpha=0.01)}


def _mlp_data(n=11, seed=3):
    rng = numpy.random.default_rng(seed)
    return rng.standard_normal((n, 5)), rng.standard_normal((n, 3))


def _unequal(comm, n):
    sizes = [1, 4, 2, 3, 1][:comm.size]
    sizes[-1] += n - sum(sizes)
    return sizes


def equivalence(comm):
    """N ranks with shard_state equal one process to 1e-10 (float64),
    MomentumSGD and Adam, equal and unequal batches."""
    x, t = _mlp_data()
    with using_config('dtype', 'float64'):
        for make in OPTIMIZERS.values():
            for sizes in (None, _unequal(comm, len(x))):
                _equivalent(comm, lambda: M.seeded(M.MLP, comm.rank), x, t,
                            comm, steps=3, make_optimizer=make,
                            local_sizes=sizes,
                            multi_node_options={'shard_state': True})


def equivalence_convnet(comm):
    x, t = _data()
    _equivalent(comm, lambda: M.seeded(M.ConvNet, comm.rank), x, t, comm,
                steps=2, make_optimizer=OPTIMIZERS['Adam'],
                multi_node_options={'shard_state': True})


def _train(comm, make_opt, steps, shard, model=None, hooks=(), opt=None):
    x, t = _mlp_data(n=4 * comm.size, seed=5)
    mine = slice(4 * comm.rank, 4 * comm.rank + 4)
    model = model or M.seeded(M.MLP, 0)
    if opt is None:
        opt = dist.create_multi_node_optimizer(
            make_opt(), comm, shard_state=shard).setup(model)
        for hook in hooks:
            opt.add_hook(hook)
        opt.broadcast_params()
    for _ in range(steps):
        opt.update(lambda: minichain.functions.mean_squared_error(
            model(x[mine]), t[mine]))
    return model, opt


def _params(model):
    return {n: p.array.copy() for n, p in model.namedparams()}


def _close(a, b, rtol=1e-10):
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        numpy.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=1e-13,
                                      err_msg=k)


def state_is_one_shard(comm):
    """The state arrays hold this rank's shard only: over the ranks they
    add up to one copy of the parameters, and no two ranks differ by more
    than one element per state array."""
    model, opt = _train(comm, OPTIMIZERS['Adam'], 2, True)
    n_params = sum(p.size for p in model.params())
    mine = sum(a.size for piece in opt.averaging.inner.pieces
               for a in piece.update_rule.state.values())
    every = comm.allgather_obj(mine)
    assert sum(every) == 2 * n_params, (every, n_params)  # m and v
    assert max(every) - min(every) <= 2, every
    assert all(p.update_rule.state is None for p in model.params())


def hooks_and_clipping(comm):
    """Weight decay and a clipping that bites give the same parameters
    with and without sharding (the norm is summed over the shards)."""
    for make in OPTIMIZERS.values():
        results = []
        for shard in (False, True):
            hooks = (optimizer_hooks.WeightDecay(0.01),
                     optimizer_hooks.GradientClipping(0.05))
            model, _ = _train(comm, make, 3, shard, hooks=hooks)
            results.append(_params(model))
        _close(*results)
    # the clipping must matter, or the check above proves nothing
    plain, _ = _train(comm, OPTIMIZERS['MomentumSGD'], 3, True)
    diff = max(abs(_params(plain)[k] - results[1][k]).max()
               for k in results[1])
    assert diff > 1e-6, diff


class _Grows(M.MLP):
    """The MLP, then ``l3`` when it has one (added and removed while it
    trains)."""

    def forward(self, x):
        h = super().forward(x)
        return self.l3(h) if hasattr(self, 'l3') else h


def _grow(model, opt, give_rule):
    with model.init_scope():
        model.l3 = M.seeded(L.Linear, 9, 3, 3)
    if give_rule:  # the rule a user (or a resumed snapshot) sets
        for p in model.l3.params():
            p.update_rule = opt.create_update_rule()


def layout_change(comm):
    """A parameter added after setup, then removed, then added back: each
    keeps its own state and ``t`` (the others' are not reset), and the
    parameters equal one process on the whole batch (float64)."""
    x, t = _mlp_data(n=4 * comm.size, seed=5)
    mine = slice(4 * comm.rank, 4 * comm.rank + 4)
    for make in OPTIMIZERS.values():
        for give_rule in (False, True):
            runs = []
            for data, wrap in (((x, t), False), ((x[mine], t[mine]), True)):
                model = M.seeded(_Grows, 0)
                base = make()
                opt = (dist.create_multi_node_optimizer(
                    base, comm, shard_state=True) if wrap else base)
                opt.setup(model)
                if wrap:
                    opt.broadcast_params()
                for k in range(8):
                    if k == 2:
                        _grow(model, base, give_rule)
                    elif k == 4:
                        removed = model.l3
                        del model.l3
                    elif k == 6:
                        with model.init_scope():
                            model.l3 = removed
                    opt.update(lambda: minichain.functions.mean_squared_error(
                        model(data[0]), data[1]))
                runs.append(_params(model))
            _close(*runs, rtol=1e-12)
    # a parameter whose shape changes after it was stepped: named on every
    # rank (its state cannot follow it), never a silent reshape or a hang
    model.l3.W.array = numpy.zeros((2, 3))
    for p in model.params():
        p.grad = numpy.zeros_like(p.array)
    _expect_error(ValueError, opt.update, 'rank {}'.format(comm.rank),
                  '/l3/W of shape (2, 3) has optimizer state',
                  'of shape (3, 3)')


class _NormRule(UpdateRule):
    def update_core(self, param):
        param.array -= param.grad / (1e-8 + abs(param.array).sum())


class _NormSGD(optimizers.SGD):
    def create_update_rule(self):
        return _NormRule(self.hyperparam)


def refusals(comm):
    model = M.seeded(M.MLP, 0)
    _expect_error(ValueError, lambda: dist.create_multi_node_optimizer(
        _NormSGD(), comm, shard_state=True).setup(model), '_NormRule',
        'element by element', 'shard_state=False')
    for option, text in (({'overlap': True}, 'overlap'),
                         ({'accumulate': 2}, 'accumulate > 1')):
        _expect_error(ValueError, lambda: dist.create_multi_node_optimizer(
            optimizers.SGD(), comm, shard_state=True, **option),
            'shard_state cannot be combined with ' + text)
    opt = dist.create_multi_node_optimizer(optimizers.SGD(), comm,
                                           shard_state=True).setup(model)
    _expect_error(TypeError, lambda: dist.join(opt).__enter__(),
                  'without double buffering or shard_state')


def nan_named_everywhere(comm):
    model = M.seeded(M.MLP, 0)
    opt = dist.create_multi_node_optimizer(
        optimizers.MomentumSGD(), comm, shard_state=True).setup(model)
    opt.broadcast_params()
    x = numpy.ones((2, 5))

    def loss():
        y = minichain.functions.sum(model(x))
        return y * numpy.nan if comm.rank == comm.size - 1 else y
    before = _params(model)
    _expect_error(dist.NonFiniteGradientError, lambda: opt.update(loss),
                  'rank {}'.format(comm.size - 1))
    _close(before, _params(model), rtol=0)


def snapshot_resumes(comm):
    """A gathered snapshot is the unsharded one (so it resumes on any
    rank count), and resuming from it continues bit-exactly."""
    for make in OPTIMIZERS.values():
        saved = {}
        for shard in (False, True):
            model, opt = _train(comm, make, 2, shard)
            if shard:
                _expect_error(RuntimeError, lambda: opt.serialize(
                    DictionarySerializer()), 'gathered_state()',
                    'rank {}'.format(comm.rank))
            with opt.gathered_state():
                s = DictionarySerializer()
                opt.serialize(s)
                model.serialize(s['model'])
            saved[shard] = s.target
        _close(saved[False], saved[True])
        # continue the sharded run; then resume a fresh one from the file
        _train(comm, make, 2, True, model=model, opt=opt)
        fresh = M.seeded(M.MLP, 7)
        again = dist.create_multi_node_optimizer(
            make(), comm, shard_state=True).setup(fresh)
        NpzDeserializer(saved[True])['model'].load(fresh)
        again.serialize(NpzDeserializer(saved[True]))
        again.needs_broadcast = False
        _train(comm, make, 2, True, model=fresh, opt=again)
        _close(_params(model), _params(fresh), rtol=0)


def snapshot_reshards(comm):
    """Saved on N ranks, resumed on N - 1 (and on 1): each rank takes its
    shard of the new layout, and training goes on as an unsharded
    optimizer resumed from the same file does."""
    make = OPTIMIZERS['Adam']
    model, opt = _train(comm, make, 2, True)
    with opt.gathered_state():
        saved = DictionarySerializer()
        opt.serialize(saved)
        model.serialize(saved['model'])
    sub = comm.split(int(comm.rank == comm.size - 1), comm.rank)
    try:
        results = []
        for shard in (True, False):
            fresh = M.seeded(M.MLP, 7)
            again = dist.create_multi_node_optimizer(
                make(), sub, shard_state=shard).setup(fresh)
            NpzDeserializer(saved.target)['model'].load(fresh)
            again.serialize(NpzDeserializer(saved.target))
            again.needs_broadcast = False
            _train(sub, make, 2, shard, model=fresh, opt=again)
            results.append(_params(fresh))
        _close(*results)
    finally:
        sub.finalize()
