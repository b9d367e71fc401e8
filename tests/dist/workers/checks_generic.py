"""Checks that do not depend on the communicator kind (see battery.py)."""
import warnings

import numpy

import minichain
from minichain import dist
from minichain import functions as F
from minichain import links as L
from minichain.dist import mpi
from minichain.dist.batch_normalization import (
    MultiNodeBatchNormalization, multi_node_batch_normalization)
from minichain.gradient_check import check_backward, check_double_backward

import _models as M
from checks_model import _expect_error, _same_on_every_rank


def ranks_and_factory(comm):
    assert comm.intra_size == comm.size and comm.inter_size == 1
    assert comm.intra_rank == comm.rank and comm.inter_rank == 0
    _expect_error(ValueError, lambda: dist.create_communicator('mpi'),
                  "'mpi'", 'naive', 'flat', 'ring', 'pure_nccl',
                  'hierarchical')
    if not minichain.backend.gpu_available():
        auto = dist.create_communicator('auto')
        assert type(auto).__name__ == 'FlatCommunicator'


def array_collectives(comm):
    r, n = comm.rank, comm.size
    x = numpy.arange(6.0).reshape(2, 3) * (r + 1)
    assert numpy.array_equal(comm.allreduce(x),
                             numpy.arange(6.0).reshape(2, 3) * n * (n + 1) / 2)
    assert numpy.allclose(comm.allreduce(x, op='mean'),
                          numpy.arange(6.0).reshape(2, 3) * (n + 1) / 2)
    assert comm.allreduce(numpy.array([r]), op='max')[0] == n - 1
    got = comm.bcast(x if r == n - 1 else None, root=n - 1)
    assert numpy.array_equal(got, numpy.arange(6.0).reshape(2, 3) * n)
    allg = comm.allgather(numpy.array([r, 10 * r], dtype=numpy.int32))
    assert allg.dtype == numpy.int32
    assert numpy.array_equal(allg, [[k, 10 * k] for k in range(n)])
    g = comm.gather(numpy.float32(r), root=0)
    assert (g is None) == (r != 0)
    if r == 0:
        assert numpy.array_equal(g, numpy.arange(n, dtype=numpy.float32))
    rows = numpy.arange(n * 2).reshape(n, 2) if r == 0 else None
    assert numpy.array_equal(comm.scatter(rows, root=0), [2 * r, 2 * r + 1])
    bad = numpy.zeros(3 if r == n - 1 and n > 1 else 2)
    if n > 1:
        msg = _expect_error(ValueError, lambda: comm.allreduce(bad),
                            'differ between ranks', '(3,)')
        _same_on_every_rank(comm, msg)
    _expect_error(ValueError, lambda: comm.allreduce(x, op='avg'), 'sum')


def object_collectives(comm):
    r, n = comm.rank, comm.size
    assert comm.bcast_obj({'a': [1, 2]} if r == 0 else None) == {'a': [1, 2]}
    got = comm.gather_obj(('rank', r), root=n - 1)
    assert got == ([('rank', k) for k in range(n)] if r == n - 1 else None)
    assert comm.allgather_obj(r * r) == [k * k for k in range(n)]
    assert comm.allreduce_obj(r) == n * (n - 1) // 2
    assert comm.allreduce_obj([r]) == list(range(n))
    assert comm.allreduce_obj(r, op='max') == n - 1


def send_recv(comm):
    r, n = comm.rank, comm.size
    if n == 1:
        return
    x = numpy.full((2, 2), r, dtype=numpy.float16)
    # Even ranks send first, odd ranks receive first: no cycle of waits.
    for send, recv in ((comm.send, comm.recv), (comm.send_obj, comm.recv_obj)):
        value = x if send == comm.send else {'from': r}
        if r % 2 == 0:
            send(value, (r + 1) % n, tag=3)
            got = recv((r - 1) % n, tag=3)
        else:
            got = recv((r - 1) % n, tag=3)
            send(value, (r + 1) % n, tag=3)
        if send == comm.send:
            assert got.dtype == numpy.float16 and (got == (r - 1) % n).all()
        else:
            assert got == {'from': (r - 1) % n}


def split(comm):
    r, n = comm.rank, comm.size
    sub = comm.split(r % 2, r)
    assert type(sub) is type(comm)
    assert sub.size == len(range(r % 2, n, 2)) and sub.rank == r // 2
    assert comm.allreduce_obj(0) == 0  # the parent still works
    model = M.as_float64(M.MLP())
    for _, p in model.namedparams():
        p.grad = numpy.full(p.shape, float(r))
    sub.multi_node_mean_grad(model)
    members = list(range(r % 2, n, 2))
    assert numpy.allclose(model.l1.W.grad, sum(members) / len(members))
    sub.finalize()


def chunked(comm):
    old = mpi.CHUNK_BYTES
    mpi.CHUNK_BYTES = 1000
    try:
        big = list(range(2000))
        assert comm.bcast_obj(big if comm.rank == 0 else None) == big
        model = M.as_float64(M.TinyResNet(ch=6))
        for _, p in model.namedparams():
            p.grad = numpy.full(p.shape, float(comm.rank))
        comm.multi_node_mean_grad(model)  # ~2.7 KB of float64 per rank
        for _, p in model.namedparams():
            assert numpy.allclose(p.grad, (comm.size - 1) / 2)
        data = numpy.arange(3000.0)
        shard = dist.scatter_dataset(data if comm.rank == 0 else None, comm,
                                     force_equal_length=False)
        assert numpy.array_equal(numpy.sort(numpy.concatenate(
            comm.allgather_obj(shard))), data)
        x = numpy.arange(700.0) + comm.rank
        assert numpy.array_equal(comm.allgather(x)[-1], x - comm.rank
                                 + comm.size - 1)
        assert numpy.array_equal(comm.bcast(x), numpy.arange(700.0))
    finally:
        mpi.CHUNK_BYTES = old


def scatter_dataset(comm):
    n_data, size = 10, comm.size
    data = numpy.arange(n_data) * 10
    shard = dist.scatter_dataset(data if comm.rank == 0 else None, comm,
                                 force_equal_length=False)
    shards = comm.allgather_obj(shard)
    assert sorted(numpy.concatenate(shards).tolist()) == data.tolist()
    lens = [len(s) for s in shards]
    assert max(lens) - min(lens) <= 1 and sum(lens) == n_data
    eq = comm.allgather_obj(dist.scatter_dataset(
        data if comm.rank == 0 else None, comm))
    assert {len(s) for s in eq} == {-(-n_data // size)}
    assert set(numpy.concatenate(eq).tolist()) == set(data.tolist())
    one = comm.allgather_obj(dist.scatter_dataset(
        data if comm.rank == 0 else None, comm, shuffle=True, seed=7,
        force_equal_length=False))
    two = comm.allgather_obj(dist.scatter_dataset(
        data if comm.rank == 0 else None, comm, shuffle=True, seed=7,
        force_equal_length=False))
    assert all(numpy.array_equal(a, b) for a, b in zip(one, two))
    assert sorted(numpy.concatenate(one).tolist()) == data.tolist()
    cols = (numpy.arange(7.0), numpy.arange(7) % 2)
    x, t = dist.scatter_dataset(cols if comm.rank == 0 else None, comm,
                                shuffle=True, seed=1)
    assert numpy.array_equal(x.astype(int) % 2, t)  # rows stay together
    items = dist.scatter_dataset(['a', 'b', 'c'] if comm.rank == 0 else None,
                                 comm, force_equal_length=False)
    assert isinstance(items, list)
    # None on the root: said on every rank (was len()'s TypeError on the
    # root alone)
    msg = _expect_error(TypeError, lambda: dist.scatter_dataset(None, comm),
                        'scatter_dataset: the dataset on rank 0 (the root) '
                        'is None')
    _same_on_every_rank(comm, msg)


def scatter_index(comm):
    idx = dist.scatter_index(9, comm, shuffle=True, seed=3,
                             force_equal_length=False)
    everything = numpy.concatenate(comm.allgather_obj(idx))
    assert sorted(everything.tolist()) == list(range(9))
    idx2 = dist.scatter_index(9, comm, shuffle=True, seed=3,
                              force_equal_length=False)
    assert numpy.array_equal(idx, idx2)


def evaluate_weighted(comm):
    data = numpy.arange(11.0)
    shard = dist.scatter_dataset(data if comm.rank == 0 else None, comm,
                                 force_equal_length=False)

    def metrics(batch):
        return {'mean': F.sum(minichain.Variable(batch)) / len(batch),
                'sq': float((batch ** 2).mean())}
    got = dist.evaluate(comm, metrics, shard, batch_size=2)
    assert abs(got['mean'] - data.mean()) < 1e-12, got
    assert abs(got['sq'] - (data ** 2).mean()) < 1e-12, got


def mnbn_gradcheck(comm):
    solo = comm.split(comm.rank, 0)  # every rank checks on its own
    rng = numpy.random.default_rng(comm.rank)
    x = rng.standard_normal((5, 3, 2, 2))
    g, b = rng.standard_normal(3) + 1.5, rng.standard_normal(3)
    gy = rng.standard_normal(x.shape)

    def f(x, g, b):
        return multi_node_batch_normalization(x, g, b, solo)
    check_backward(f, (x, g, b), gy, eps=1e-6, atol=1e-7, rtol=1e-6)
    ggs = tuple(rng.standard_normal(a.shape) for a in (x, g, b))
    check_double_backward(f, (x, g, b), gy, ggs, eps=1e-5, atol=1e-6,
                          rtol=1e-5)
    solo.finalize()


def mnbn_matches_full_batch(comm):
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal((3 * comm.size + 1, 4, 3)) * 3 + 7
    lo = [0] + [3 * k + 1 for k in range(1, comm.size)] + [len(x)]
    mine = x[lo[comm.rank]:lo[comm.rank + 1]]
    gamma, beta = rng.standard_normal(4), rng.standard_normal(4)
    rm, rv = numpy.zeros(4), numpy.ones(4)
    y = multi_node_batch_normalization(mine, gamma, beta, comm,
                                       running_mean=rm, running_var=rv)
    rm0, rv0 = numpy.zeros(4), numpy.ones(4)
    want = F.batch_normalization(x, gamma, beta, running_mean=rm0,
                                 running_var=rv0).array
    assert numpy.allclose(y.array, want[lo[comm.rank]:lo[comm.rank + 1]],
                          rtol=1e-12, atol=1e-12)
    assert numpy.allclose(rm, rm0, rtol=1e-12) and numpy.allclose(
        rv, rv0, rtol=1e-12)


def mnbn_device_formula(comm):
    # The GPU combines the moments with one allreduce of sums instead of
    # Chan's Allgather; run that code on NumPy arrays (comm.allreduce takes
    # the host path) and compare with the host combination and the truth.
    from minichain.dist.batch_normalization import _GlobalMoments
    rng = numpy.random.default_rng(11)
    x = rng.standard_normal((2 * comm.size + 3, 4, 5)) * 2 + 50
    lo = [0] + [2 * k + 3 for k in range(1, comm.size)] + [len(x)]
    mine = x[lo[comm.rank]:lo[comm.rank + 1]]  # unequal local batches
    axes = (0, 2)
    n = mine.size // 4
    s = mine.sum(axis=axes)
    local_mean = s / n
    m2 = ((mine - local_mean[None, :, None]) ** 2).sum(axis=axes)
    node = _GlobalMoments(comm, axes)
    mean_h, var_h, total_h = node._combine_on_host(n, s, m2)
    mean_d, var_d, total_d = node._combine_on_device(n, s, m2, local_mean)
    assert total_d == total_h == len(x) * 5, (total_d, total_h)
    want_mean, want_var = x.mean(axis=axes), x.var(axis=axes)
    assert numpy.allclose(mean_d, want_mean, rtol=1e-13, atol=0)
    assert numpy.allclose(var_d, want_var, rtol=1e-9, atol=0), (var_d,
                                                                 want_var)
    assert numpy.allclose(mean_h, want_mean, rtol=1e-13, atol=0)
    assert numpy.allclose(var_h, want_var, rtol=1e-12, atol=0)


def mnbn_model_copy(comm):
    model = M.as_float64(M.TinyResNet())
    model.bn.avg_mean[...] = 3.0
    mn = dist.create_mnbn_model(model, comm)
    kinds = [type(link).__name__ for _, link in mn.namedlinks()
             if isinstance(link, L.BatchNormalization)]
    assert kinds == ['MultiNodeBatchNormalization'] * 5, kinds
    assert all(type(link) is L.BatchNormalization
               for _, link in model.namedlinks()
               if isinstance(link, L.BatchNormalization))  # original intact
    assert [n for n, _ in mn.namedparams()] == [
        n for n, _ in model.namedparams()]
    assert (mn.bn.avg_mean == 3.0).all() and mn.bn.comm is comm
    again = dist.create_mnbn_model(mn, comm)  # copying an MNBN keeps comm
    assert again.bn.comm is comm and again.bn is not mn.bn
    bn = MultiNodeBatchNormalization(4, comm, dtype=numpy.float64)
    assert [n for n, _ in bn.namedparams()] == ['/beta', '/gamma']
    assert [n for n, _ in bn.namedpersistents()] == [
        '/N', '/avg_mean', '/avg_var']
    # A ResNet block's end, bn(h, residual=s, relu=True), is the separate
    # ops here too, in training and in evaluation.
    rng = numpy.random.default_rng(comm.rank)
    h, s = rng.standard_normal((2, 3, 4, 3, 3))
    for train in (True, False):
        with minichain.using_config('train', train):
            want = F.relu(bn(h) + s).array
            got = bn(h, residual=s, relu=True).array
        assert numpy.array_equal(got, want), (train, abs(got - want).max())


def local_errors_everywhere(comm):
    # A bad argument on one rank is raised on every rank (it travels in the
    # header), so that no rank goes on alone into the next collective.
    last = comm.size - 1
    x = numpy.ones(3)
    msg = _expect_error(ValueError, lambda: comm.allreduce(
        x, op='avg' if comm.rank == last else 'sum'), 'op must be one of')
    if comm.size > 1:
        assert '(on rank {})'.format(last) in msg, msg
    _same_on_every_rank(comm, msg)
    msg = _expect_error(TypeError, lambda: comm.allgather(
        [1.0] if comm.rank == last else x), 'expected a NumPy or CuPy array')
    _same_on_every_rank(comm, msg)
    _expect_error(ValueError, lambda: dist.scatter_index(
        -1, comm), 'must be 0 or more, got n=-1')
    # An error one rank meets between collectives: the others raise it in
    # their next collective.
    def unreadable():
        if comm.rank == last:
            comm.raise_everywhere(OSError('batch 7 is unreadable'))
        comm.allreduce_obj(1)
    msg = _expect_error(OSError, unreadable, 'batch 7 is unreadable')
    if comm.size > 1:
        assert msg.endswith('(on rank {})'.format(last)), msg
    _same_on_every_rank(comm, msg)
    assert numpy.array_equal(comm.allreduce(x), x * comm.size)  # in step


def collective_kinds_compared(comm):
    if comm.size == 1:
        return
    first = comm.rank == 0
    msg = _expect_error(dist.CollectiveMismatchError, lambda: (
        comm.allgather_obj(1) if first else comm.allreduce_obj(1)),
        'rank 0: allgather_obj #', 'allreduce_obj #',
        'different collectives of the flat communicator')
    _same_on_every_rank(comm, msg)
    model = minichain.Sequential(L.Linear(3, 2))
    model(numpy.zeros((1, 3), numpy.float32))
    for p in model.params():
        p.grad = numpy.ones_like(p.array)
    msg = _expect_error(dist.CollectiveMismatchError, lambda: (
        comm.multi_node_mean_grad(model, step=4 if first else 3)),
        'different training steps', 'rank 0: update 5', 'update 4')
    _same_on_every_rank(comm, msg)


def header_persistent_request(comm):
    """The header's MAX allreduce is one persistent request where the MPI
    has them (MPI 4: MPICH), a new Iallreduce where not (Open MPI 4.1);
    either way the values are combined, and another length works too."""
    if comm.size == 1:
        return
    from mpi4py import MPI
    wire = comm.wire
    comm.allreduce_obj(1)  # a collective: its header made the request
    buf, request = wire.persistent_max
    assert (request is not None) == (MPI.Get_version() >= (4, 0)), (
        MPI.Get_version(), request)
    top = comm.size - 1
    for _ in range(2):  # the persistent request again
        got = wire.allreduce_max([comm.rank] * 15 + [-comm.rank])
        assert got == [top] * 15 + [0], got
    assert wire.allreduce_max([comm.rank, 3]) == [top, 3]
    assert wire.persistent_max[0] is buf


def join_uneven_shards(comm):
    # Rank r has r + 1 batches of 2: inside join every update averages over
    # the ranks that still have data and every rank applies it, as one
    # process stepping on the union of those ranks' batches.
    rng = numpy.random.default_rng(3)
    n, r = comm.size, comm.rank
    xs, ts = rng.standard_normal((n, n, 2, 3)), rng.standard_normal(
        (n, n, 2, 2))

    def make():
        with minichain.using_config('dtype', 'float64'):
            m = minichain.Sequential(L.Linear(3, 2))
        m(xs[0, 0])
        return m
    model, ref = make(), make()
    opt = dist.create_multi_node_optimizer(
        minichain.optimizers.MomentumSGD(lr=0.1), comm).setup(model)
    opt.update()  # rank 0's parameters everywhere
    ref.copyparams(model)
    with dist.join(opt) as joined:
        for k in range(r + 1):
            joined.update(lambda: F.mean_squared_error(model(xs[r, k]),
                                                       ts[r, k]))
    assert opt.t == n, opt.t
    ref_opt = minichain.optimizers.MomentumSGD(lr=0.1).setup(ref)
    for k in range(n):  # step k: ranks k, ..., n - 1 have data
        x, t = numpy.concatenate(xs[k:, k]), numpy.concatenate(ts[k:, k])
        ref_opt.update(lambda: F.mean_squared_error(ref(x), t))
    for (name, p), (_, q) in zip(model.namedparams(), ref.namedparams()):
        assert numpy.allclose(p.array, q.array, rtol=1e-12, atol=1e-14), name
    _same_on_every_rank(comm, [p.array.tolist() for p in model.params()])
    # Without join the rank with more batches is left alone: see
    # tests/dist/test_watchdog.py ('uneven').


def nan_check(comm):
    last = comm.size - 1

    def run(check):
        model = minichain.Sequential(L.Linear(3, 2))
        model(numpy.zeros((1, 3), numpy.float32))
        opt = dist.create_multi_node_optimizer(
            minichain.optimizers.SGD(lr=0.1), comm, nan_check=check)
        opt.setup(model)
        opt.update()
        x = numpy.ones((2, 3), numpy.float32)
        opt.update(lambda: F.sum(model(x)))
        before = [p.array.copy() for p in model.params()]
        if comm.rank == last:
            x[1, 2] = numpy.nan
        return model, opt, before, lambda: opt.update(
            lambda: F.sum(model(x)))
    model, opt, before, step = run(True)
    msg = _expect_error(dist.NonFiniteGradientError, step, 'update 2',
                        'not finite on rank {}'.format(last), '/0/W',
                        'skipped on every rank')
    _same_on_every_rank(comm, msg)
    assert all(numpy.array_equal(p.array, b)
               for p, b in zip(model.params(), before))
    assert opt.t == 1
    model, opt, _, step = run(False)  # the negative control
    step()
    assert not numpy.isfinite(model[0].W.array).all()


def mnbn_global_batch_of_one(comm):
    # As L.BatchNormalization: training statistics need two values per
    # channel over the whole (global) batch.
    x = numpy.ones((1 if comm.rank == 0 else 0, 3))
    gamma, beta = numpy.ones(3), numpy.zeros(3)
    msg = _expect_error(ValueError, lambda: multi_node_batch_normalization(
        x, gamma, beta, comm), 'global batch has 1 element per channel',
        'at least 2')
    _same_on_every_rank(comm, msg.split(' (x of shape')[0])
    if comm.size > 1:
        two = numpy.ones((1 if comm.rank < 2 else 0, 3))
        multi_node_batch_normalization(two, gamma, beta, comm)


def mnbn_nan_refused_everywhere(comm):
    # A NaN on the last rank's shard makes the global statistics NaN on
    # every rank: each keeps its running values and says so.
    bn = MultiNodeBatchNormalization(3, comm, dtype=numpy.float64)
    x = numpy.random.default_rng(comm.rank).standard_normal((2, 3, 2))
    bn(x)
    mean, var = bn.avg_mean.copy(), bn.avg_var.copy()
    if comm.rank == comm.size - 1:
        x[1, 2, 0] = numpy.nan
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        bn(x)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and messages[0].startswith(
        'MultiNodeBatchNormalization None: the batch statistics are not '
        'finite (channel 2'), messages
    assert numpy.array_equal(bn.avg_mean, mean)
    assert numpy.array_equal(bn.avg_var, var)
    bn(numpy.ones((2, 3, 2)) * comm.rank)  # the next batch is taken
    assert not numpy.array_equal(bn.avg_mean, mean)
