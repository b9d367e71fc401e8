"""Model-level checks run once per CPU communicator (see battery.py)."""
import numpy

import minichain
from minichain import dist
from minichain import links as L
from minichain import optimizers
from minichain.configuration import using_config
from minichain.dist.testing import (NotEnoughRanksError,
                                    assert_data_parallel_equivalent)

import _models as M


def _expect_error(exc_type, fn, *contains):
    try:
        fn()
    except exc_type as e:
        for text in contains:
            assert text in str(e), 'missing {!r} in:\n{}'.format(text, e)
        return str(e)
    raise AssertionError('{} was not raised'.format(exc_type.__name__))


def _same_on_every_rank(comm, value):
    values = comm.allgather_obj(value)
    assert all(v == values[0] for v in values), values


def _data(n=12, seed=1):
    rng = numpy.random.default_rng(seed)
    return (rng.standard_normal((n, 2, 4, 4)),
            rng.integers(0, 3, n).astype(numpy.int32))


def closed_form(comm):
    with using_config('dtype', 'float64'):
        model = minichain.Sequential(L.Linear(3, 4), L.Linear(None, 2))
        model(numpy.zeros((1, 3)))  # lazy initialization of the second layer
    for _ in range(2):  # the second call reuses the packed buffer
        for k, (_, p) in enumerate(model.namedparams()):
            p.grad = numpy.full(p.shape, comm.rank + k, dtype=p.dtype)
        comm.multi_node_mean_grad(model)
        for k, (name, p) in enumerate(model.namedparams()):
            want = (comm.size - 1) / 2 + k
            assert numpy.allclose(p.grad, want, rtol=1e-14, atol=0), (
                name, p.grad, want)


def bcast_data(comm):
    model = M.as_float64(M.TinyResNet())
    for _, p in model.namedparams():
        p.array[...] = comm.rank + 1.0
    model.bn.avg_mean[...] = comm.rank + 2.0
    model.bn.N = comm.rank + 3
    comm.bcast_data(model)
    for name, p in model.namedparams():
        assert (p.array == 1.0).all(), name
    assert (model.bn.avg_mean == 2.0).all()
    assert model.bn.N == 3 and isinstance(model.bn.N, int)


def zero_fill(comm):
    model = M.as_float64(M.MLP())
    for name, p in model.namedparams():
        if name.startswith('/l2') and comm.rank % 2 == 1:
            p.grad = None
        else:
            p.grad = numpy.full(p.shape, comm.rank + 1.0)
    model.l1.b.grad = None  # missing everywhere: stays None
    comm.multi_node_mean_grad(model, zero_fill=True)
    even = [r + 1.0 for r in range(comm.size) if r % 2 == 0]
    assert numpy.allclose(model.l2.W.grad, sum(even) / comm.size)
    assert numpy.allclose(model.l1.W.grad, (comm.size + 1) / 2)
    assert model.l1.b.grad is None


def missing_grad_error(comm):
    model = M.as_float64(M.MLP())
    for _, p in model.namedparams():
        p.grad = numpy.ones(p.shape)
    if comm.rank == comm.size - 1:
        model.l2.b.grad = None
    if comm.size == 1:  # missing everywhere: skipped, no error
        comm.multi_node_mean_grad(model)
        assert model.l2.b.grad is None
        return
    msg = _expect_error(ValueError, lambda: comm.multi_node_mean_grad(model),
                        '/l2/b', 'rank {}'.format(comm.size - 1), 'zero_fill')
    _same_on_every_rank(comm, msg)


def layout_change(comm):
    model = M.as_float64(M.MLP())
    for _ in range(2):
        for _, p in model.namedparams():
            p.grad = numpy.full(p.shape, float(comm.rank))
        comm.multi_node_mean_grad(model)
        assert numpy.allclose(model.l1.W.grad, (comm.size - 1) / 2)
        with model.init_scope():  # every rank grows the model the same way
            model.extra = minichain.Parameter(numpy.zeros(3))


def mismatch_error(comm):
    model = M.as_float64(M.MLP(n_hidden=8 if comm.rank == comm.size - 1
                               else 7))
    for _, p in model.namedparams():
        p.grad = numpy.ones(p.shape)
    if comm.size == 1:
        comm.multi_node_mean_grad(model)
        return
    msg = _expect_error(dist.ModelMismatchError,
                        lambda: comm.multi_node_mean_grad(model),
                        'differs between ranks', '/l1/W', '(7, 5) float64',
                        '(8, 5) float64', 'rank {}'.format(comm.size - 1))
    _same_on_every_rank(comm, msg)
    msg = _expect_error(dist.ModelMismatchError,
                        lambda: comm.bcast_data(model), 'bcast_data')
    _same_on_every_rank(comm, msg)


def uninitialized_bcast(comm):
    model = minichain.Sequential(L.Linear(None, 2))
    msg = _expect_error(ValueError, lambda: comm.bcast_data(model),
                        '/0/W', 'not initialized')
    _same_on_every_rank(comm, msg)


def optimizer_wrapper(comm):
    model = M.seeded(M.MLP, comm.rank)
    opt = dist.create_multi_node_optimizer(
        optimizers.MomentumSGD(lr=0.1), comm).setup(model)
    x = numpy.random.default_rng(comm.rank).standard_normal((4, 5))

    def loss():
        return minichain.functions.sum(model(x) ** 2)
    opt.update(loss)  # broadcasts, does not step
    assert opt.t == 0
    for _, p in model.namedparams():
        values = comm.allgather(p.array)
        assert (values == values[0]).all()
    opt.lr = 0.05  # delegated to the wrapped optimizer
    assert opt.actual_optimizer.lr == 0.05
    opt.update(loss)
    assert opt.t == 1
    for _, p in model.namedparams():  # same averaged step everywhere
        values = comm.allgather(p.array)
        assert (values == values[0]).all()
    _expect_error(ValueError, lambda: dist.create_multi_node_optimizer(
        optimizers.SGD(), comm, double_buffering=True), 'pure_nccl')
    # before setup: the plain optimizer's advice, not 'NoneType' has no
    # attribute 'cleargrads'
    bare = dist.create_multi_node_optimizer(optimizers.SGD(), comm)
    for call in (lambda: bare.update(loss), bare.broadcast_params):
        _expect_error(RuntimeError, call, 'multi-node optimizer (SGD).',
                      ': call setup(link) first')
    # broadcast_params(): equal now, so that the first update steps
    other = M.seeded(M.MLP, comm.rank + 1)
    opt = dist.create_multi_node_optimizer(
        optimizers.SGD(lr=0.1), comm).setup(other)
    assert opt.broadcast_params() is opt
    for _, p in other.namedparams():
        values = comm.allgather(p.array)
        assert (values == values[0]).all()
    opt.update(lambda: minichain.functions.sum(other(x) ** 2))
    assert opt.t == 1


def _equivalent(comm, *args, **kwargs):
    """assert_data_parallel_equivalent; on one rank, its refusal (one
    process compared with itself would pass whatever the model does)."""
    def run():
        assert_data_parallel_equivalent(*args, **kwargs)
    if comm.size > 1:
        return run()
    _expect_error(NotEnoughRanksError, run, 'has 1 rank', 'compared with '
                  'itself', '@pytest.mark.mpi(ranks=[2, 3])', 'mpiexec -n 2')


def equivalence_mlp(comm):
    rng = numpy.random.default_rng(3)
    x, t = rng.standard_normal((10, 5)), rng.standard_normal((10, 3))
    with using_config('dtype', 'float64'):
        _equivalent(comm, lambda: M.seeded(M.MLP, comm.rank), x, t, comm,
                    steps=3)


def equivalence_convnet(comm):
    x, t = _data()
    _equivalent(comm, lambda: M.seeded(M.ConvNet, comm.rank), x, t, comm,
                steps=3)


def _mnbn_resnet(comm):
    return dist.create_mnbn_model(M.seeded(M.TinyResNet, comm.rank + 10),
                                  comm)


def equivalence_resnet_mnbn(comm):
    x, t = _data()
    _equivalent(comm, lambda: _mnbn_resnet(comm), x, t, comm, steps=3)


def negative_control_per_rank_bn(comm):
    x, t = _data()

    def run():
        _equivalent(comm, lambda: M.seeded(M.TinyResNet, comm.rank + 10), x,
                    t, comm, steps=2)
    if comm.size == 1:
        return run()
    _expect_error(AssertionError, run, 'differs from one process', '/bn/',
                  'data-parallel', 'rtol 1e-10')


def negative_control_summed_loss(comm):
    """A loss summed over the batch instead of averaged: with equal shards
    every gradient is 1/size of one process's, and the message says why."""
    x, t = _data()

    def run():
        _equivalent(comm, lambda: M.seeded(M.ConvNet, comm.rank), x, t, comm,
                    lossfun=lambda model, x, t: minichain.functions.sum(
                        minichain.functions.softmax_cross_entropy(
                            model(x), t, reduce='no')))
    if comm.size == 1:
        return run()
    _expect_error(AssertionError, run, 'step 1, the gradients: data-'
                  'parallel / single-process = {:.6g} for every element, '
                  'which is 1/{}'.format(1 / comm.size, comm.size),
                  'the loss is summed over the batch instead of averaged')


def unequal_batches_mnbn(comm):
    x, t = _data(n=13)
    sizes = [1, 5, 2, 4][:comm.size]
    sizes[-1] += 13 - sum(sizes)
    _equivalent(comm, lambda: _mnbn_resnet(comm), x, t, comm, steps=2,
                local_sizes=sizes)


def equivalence_options(comm):
    x, t = _data(n=4)
    _expect_error(ValueError, lambda: assert_data_parallel_equivalent(
        lambda: M.seeded(M.ConvNet, 0), x, t, comm,
        multi_node_options={'overlapp': True}), "['overlapp']",
                  "'double_buffering'")
    if comm.size > 1:  # double buffering is for NCCL communicators only
        _expect_error(ValueError, lambda: assert_data_parallel_equivalent(
            lambda: M.seeded(M.ConvNet, 0), x, t, comm,
            multi_node_options={'double_buffering': True}), 'pure_nccl')


def equivalence_shard_state(comm):
    """shard_state=True (tests/dist/test_shard.py has the rest), unequal
    batches of a model with batch normalization across ranks."""
    x, t = _data(n=13)
    sizes = [1, 5, 2, 4][:comm.size]
    sizes[-1] += 13 - sum(sizes)
    _equivalent(comm, lambda: _mnbn_resnet(comm), x, t, comm, steps=2,
                local_sizes=sizes, make_optimizer=lambda: optimizers.Adam(
                    alpha=0.01), multi_node_options={'shard_state': True})
