"""Overlapped averaging and gradient accumulation (see battery.py): the
same numbers as without overlap and as one process, buckets launched while
backward runs, and every misuse raised on every rank."""
import numpy

import minichain
from minichain import FunctionNode, Variable, dist, optimizers
from minichain import functions as F
from minichain.configuration import using_config
from minichain.dist.failures import format_ranks

import _models as M
from checks_model import (_data, _equivalent, _expect_error, _mnbn_resnet,
                          _same_on_every_rank)

TINY_MB = 1e-4  # about 100 bytes: nearly one bucket per parameter
OVERLAP = {'overlap': True, 'bucket_mb': TINY_MB}


def _unequal(n):
    return [2, 5, 3, 4][:n]


def overlap_equivalence_mlp(comm):
    rng = numpy.random.default_rng(3)
    x, t = rng.standard_normal((10, 5)), rng.standard_normal((10, 3))
    with using_config('dtype', 'float64'):
        _equivalent(comm, lambda: M.seeded(M.MLP, comm.rank), x, t, comm,
                    steps=3, multi_node_options=OVERLAP)


def overlap_equivalence_mnbn_unequal(comm):
    sizes = _unequal(comm.size)
    x, t = _data(n=sum(sizes))
    _equivalent(comm, lambda: _mnbn_resnet(comm), x, t, comm, steps=2,
                local_sizes=sizes, multi_node_options=OVERLAP)


def overlap_shared_and_unused(comm):
    # The shared layer's gradient is final after its second use; the unused
    # parameter has no gradient on any rank and stays None (MomentumSGD
    # then leaves it alone, as one process does).
    rng = numpy.random.default_rng(5)
    x, t = rng.standard_normal((9, 5)), rng.integers(0, 3, 9).astype(
        numpy.int32)
    _equivalent(comm, lambda: M.seeded(M.SharedUnused, comm.rank), x, t,
                comm, steps=3, multi_node_options=OVERLAP)


def _trajectory(comm, make, x, t, steps, **options):
    """Every step's averaged gradients and the final parameters of a
    data-parallel run on this rank's shard, and the optimizer."""
    model = make()
    opt = dist.create_multi_node_optimizer(
        optimizers.MomentumSGD(lr=0.1), comm, **options).setup(model)
    n = len(x) // comm.size
    xs, ts = x[comm.rank * n:(comm.rank + 1) * n], t[comm.rank * n:(
        comm.rank + 1) * n]
    opt.update()
    grads = []
    for _ in range(steps):
        opt.update(lambda: F.softmax_cross_entropy(model(xs), ts))
        grads.append([None if p.grad is None else p.grad.copy()
                      for p in model.params()])
    return grads, [p.array.copy() for p in model.params()], opt


def _close(got, want, rtol, what):
    scale = max(float(numpy.abs(w).max()) for w in want if w is not None)
    for g, w in zip(got, want):
        assert (g is None) == (w is None), what
        if g is not None:
            err = float(numpy.abs(g - w).max())
            assert err <= rtol * scale, (what, err, scale)


def overlap_equals_plain(comm):
    x, t = _data(n=4 * comm.size)

    def make():
        return M.seeded(M.ConvNet, 0)
    plain_g, plain_w, _ = _trajectory(comm, make, x, t, 3)
    for mb in (TINY_MB, None):  # many buckets; one (25 MiB)
        g, w, opt = _trajectory(comm, make, x, t, 3, overlap=True,
                                bucket_mb=mb)
        for k in range(3):
            _close(g[k], plain_g[k], 1e-10, ('gradient', mb, k))
        _close(w, plain_w, 1e-10, ('parameters', mb))
        buckets = opt.reducer.plan.buckets
        assert (len(buckets) > 2) == (mb is not None), len(buckets)
        # After the first step (which records the order), every bucket is
        # launched by a hook, while backward still runs.
        assert opt.reducer.launched_in_backward == len(buckets)


class _Tap(FunctionNode):
    """The identity; its backward (the walk's last function here) calls
    ``seen()``."""

    def __init__(self, seen):
        self.seen = seen

    def forward(self, inputs):
        return inputs[0],

    def backward(self, indexes, grad_outputs):
        self.seen()
        return grad_outputs[0],


def _overlapped_convnet(comm):
    """A seeded ConvNet under an overlapped SGD in nearly one bucket per
    parameter, and a batch of two."""
    model = M.seeded(M.ConvNet, 1)
    opt = dist.create_multi_node_optimizer(
        optimizers.SGD(lr=0.1), comm, overlap=True, bucket_mb=TINY_MB)
    opt.setup(model)
    return (model, opt) + tuple(_data(n=2))


def overlap_launches_during_backward(comm):
    # Checked from the order of events, not from timing: when the last
    # function of backward runs (a tap on the input, below the first
    # layer), every bucket has been launched; when the first gradient is
    # final (the classifier's), none has; between them they go one by one.
    model, opt, x, t = _overlapped_convnet(comm)
    log = []
    reducer = opt.reducer

    def launched():
        return None if reducer.step is None else reducer.step.next
    model.register_grad_hook(lambda p: log.append(launched()))

    def loss():
        xv = _Tap(lambda: log.append(('input', launched()))).apply(
            (Variable(x),))[0]
        return F.softmax_cross_entropy(model(xv), t)
    opt.update(loss)
    opt.update(loss)  # records the order
    del log[:]
    opt.update(loss)
    n = len(reducer.plan.buckets)
    assert n > 2 and log[-1] == ('input', n), (log, n)
    launched = log[:-1]
    assert launched[0] == 0 and launched == sorted(launched), launched
    assert len(set(launched)) > 2, launched


def overlap_hashes_a_layout_once(comm):
    # The header compares the model's layout by a hash that is computed
    # once per layout: the training step has slots of its own (hashed with
    # the layout, the overlapped averaging wrote out and hashed the repr
    # of the whole model at every step).
    from minichain.dist.guards import agreement
    model, opt, x, t = _overlapped_convnet(comm)

    def loss():
        return F.softmax_cross_entropy(model(x), t)
    for _ in range(3):  # bcast_data's layout; no plan yet; the plan's
        opt.update(loss)
    digest, digests = agreement._digest, []
    agreement._digest = lambda layout: digests.append(1) or digest(layout)
    try:
        for _ in range(3):
            opt.update(loss)
    finally:
        agreement._digest = digest
    assert not digests, digests


def accumulate_equals_large_batch(comm):
    # k micro-batches per rank, one update each; only the k-th averages
    # and steps: one process stepping on the whole batch at once.
    k, b, steps = 3, 2, 2
    rng = numpy.random.default_rng(8)
    n = comm.size * k * b
    x, t = rng.standard_normal((n, 5)), rng.standard_normal((n, 3))
    with using_config('dtype', 'float64'):
        ref = M.seeded(M.MLP, 0)
        ref_opt = optimizers.MomentumSGD(lr=0.1).setup(ref)
        want = []
        for _ in range(steps):
            ref_opt.update(lambda: F.mean_squared_error(ref(x), t))
            want.append([p.grad.copy() for p in ref.params()])
        mine = x[comm.rank * k * b:(comm.rank + 1) * k * b]
        mine_t = t[comm.rank * k * b:(comm.rank + 1) * k * b]
        for overlap in (False, True):
            model = M.seeded(M.MLP, 0)
            opt = dist.create_multi_node_optimizer(
                optimizers.MomentumSGD(lr=0.1), comm, overlap=overlap,
                bucket_mb=TINY_MB, accumulate=k).setup(model)
            opt.update()
            for step in range(steps):
                for j in range(k):
                    opt.update(lambda: F.mean_squared_error(
                        model(mine[j * b:(j + 1) * b]),
                        mine_t[j * b:(j + 1) * b]))
                    assert opt.t == step + (j == k - 1)
                _close([p.grad for p in model.params()], want[step], 1e-10,
                       ('accumulated gradient', overlap, step))
            _close([p.array for p in model.params()],
                   [p.array for p in ref.params()], 1e-10,
                   ('parameters', overlap))


def accumulate_equivalence_mnbn(comm):
    # Synchronized BN normalizes micro-batch j of every rank together; the
    # reference accumulates those global micro-batches.
    sizes = [s + 2 for s in _unequal(comm.size)]
    x, t = _data(n=sum(sizes))
    for options in ({'accumulate': 2}, dict(OVERLAP, accumulate=2)):
        _equivalent(comm, lambda: _mnbn_resnet(comm), x, t, comm, steps=2,
                    local_sizes=sizes, multi_node_options=options)


def overlap_transfer_float32(comm):
    # float64 gradients averaged in float32 (flat's narrowest transfer; the
    # NCCL paths' float16 and bfloat16 are checked on a GPU: workers/gpu.py
    # overlap, tests/dist/test_gpu.py)
    x, t = _data(n=4 * comm.size)

    def make():
        return M.seeded(M.ConvNet, 2)
    comm32 = dist.create_communicator('flat',
                                      allreduce_grad_dtype=numpy.float32)
    try:
        want, _, _ = _trajectory(comm, make, x, t, 2)
        got, _, _ = _trajectory(comm32, make, x, t, 2, **OVERLAP)
        for k in range(2):
            _close(got[k], want[k], 1e-6, ('float32 transfer', k))
    finally:
        comm32.finalize()


def overlap_bucket_mismatch(comm):
    # A different bucket size on the last rank: its plan would post other
    # buffers, so the first averaging raises on every rank instead.
    model = M.seeded(M.MLP, 0)
    mb = 2e-4 if comm.rank == comm.size - 1 else TINY_MB
    opt = dist.create_multi_node_optimizer(
        optimizers.SGD(lr=0.1), comm, overlap=True, bucket_mb=mb).setup(model)
    opt.update()
    x = numpy.ones((2, 5))

    def step():
        opt.update(lambda: F.sum(model(x)))
    if comm.size == 1:
        return step()
    msg = _expect_error(dist.ModelMismatchError, step, 'differs between '
                        'ranks', '(overlap)', 'rank {}'.format(comm.size - 1))
    _same_on_every_rank(comm, msg)


def overlap_model_change_in_backward(comm):
    # After a step with equal models the last rank adds a parameter: the
    # others find out in their first hook of the next backward (the header
    # of the buckets), the last rank in its update; all raise.
    model = M.seeded(M.MLP, 0)
    opt = dist.create_multi_node_optimizer(
        optimizers.SGD(lr=0.1), comm, **OVERLAP).setup(model)
    x = numpy.ones((2, 5))

    def step():
        opt.update(lambda: F.sum(model(x)))
    step()
    step()
    if comm.size == 1:
        return
    if comm.rank == comm.size - 1:
        with model.init_scope():
            model.extra = minichain.Parameter(numpy.zeros(3))
    msg = _expect_error(dist.ModelMismatchError, step, '/extra', '(3,)')
    _same_on_every_rank(comm, msg)


def overlap_partial_gradients(comm):
    # A branch used on even ranks only: averaged as zeros where missing
    # (as without overlap), or an error on every rank with zero_fill=False.
    def make():
        return M.seeded(M.SharedUnused, 0)
    x = numpy.random.default_rng(1).standard_normal((2, 5))

    def loss(model):
        y = F.sum(model(x))
        return y + F.sum(model.unused) if comm.rank % 2 == 0 else y
    results = []
    for options in ({}, OVERLAP):
        model = make()
        opt = dist.create_multi_node_optimizer(
            optimizers.SGD(lr=0.1), comm, **options).setup(model)
        opt.update()
        for _ in range(2):
            opt.update(lambda: loss(model))
        results.append([p.array.copy() for p in model.params()])
    _close(results[1], results[0], 1e-12, 'zero-filled')
    if comm.size == 1:
        return
    model = make()
    opt = dist.create_multi_node_optimizer(
        optimizers.SGD(lr=0.1), comm, zero_fill=False, **OVERLAP)
    opt.setup(model).update()
    odd = format_ranks(list(range(1, comm.size, 2)))
    msg = _expect_error(ValueError, lambda: opt.update(lambda: loss(model)),
                        'some ranks only', '/unused: no gradient on ' + odd)
    _same_on_every_rank(comm, msg)


def overlap_second_backward_raises(comm):
    model = M.seeded(M.MLP, 0)
    opt = dist.create_multi_node_optimizer(
        optimizers.SGD(lr=0.1), comm, **OVERLAP).setup(model)
    x = numpy.ones((2, 5))
    opt.update()
    for _ in range(2):
        opt.update(lambda: F.sum(model(x)))
    model.cleargrads()
    F.sum(model(x)).backward()
    _expect_error(RuntimeError, lambda: F.sum(model(x) * 2.0).backward(),
                  'became final twice', 'accumulate=k')
    opt.update()  # completes the buckets sent by the first backward
    assert opt.t == 3


def overlap_join_uneven(comm):
    # Inside join the hooks stand down (ranks without data shadow the
    # updates after backward); overlap resumes after it.
    rng = numpy.random.default_rng(4)
    n, r = comm.size, comm.rank
    xs, ts = rng.standard_normal((n + 2, n, 2, 5)), rng.standard_normal(
        (n + 2, n, 2, 3))
    model, ref = M.seeded(M.MLP, 0), M.seeded(M.MLP, 0)
    opt = dist.create_multi_node_optimizer(
        optimizers.MomentumSGD(lr=0.1), comm, **OVERLAP).setup(model)
    ref_opt = optimizers.MomentumSGD(lr=0.1).setup(ref)
    opt.update()

    def both(k, ranks):
        opt.update(lambda: F.mean_squared_error(model(xs[k, r]), ts[k, r]))
        x, t = numpy.concatenate(xs[k, ranks]), numpy.concatenate(ts[k,
                                                                     ranks])
        ref_opt.update(lambda: F.mean_squared_error(ref(x), t))
    both(0, list(range(n)))
    with dist.join(opt) as joined:
        for k in range(r + 1):
            joined.update(lambda: F.mean_squared_error(model(xs[1 + k, r]),
                                                       ts[1 + k, r]))
    for k in range(n):  # step k of join: ranks k, ..., n - 1 have data
        x, t = numpy.concatenate(xs[1 + k, k:]), numpy.concatenate(
            ts[1 + k, k:])
        ref_opt.update(lambda: F.mean_squared_error(ref(x), t))
    both(n + 1, list(range(n)))
    assert opt.reducer.launched_in_backward > 0
    _close([p.array for p in model.params()],
           [p.array for p in ref.params()], 1e-12, 'join')


def accumulate_join_uneven(comm):
    # join with accumulate=2: rank r has r + 1 steps of 2 micro-batches; a
    # rank out of data shadows whole steps (2 updates each), and the mean
    # is over the ranks with data and the micro-batches, as one process
    # stepping on their union. Then two steps of every rank, as usual (the
    # second overlapped: the first makes the bucket plan).
    k, rng = 2, numpy.random.default_rng(5)
    n, r = comm.size, comm.rank
    xs, ts = rng.standard_normal((n + 2, n, k, 2, 5)), rng.standard_normal(
        (n + 2, n, k, 2, 3))
    with using_config('dtype', 'float64'):
        for overlap in (False, True):
            model, ref = M.seeded(M.MLP, 0), M.seeded(M.MLP, 0)
            opt = dist.create_multi_node_optimizer(
                optimizers.MomentumSGD(lr=0.1), comm, overlap=overlap,
                bucket_mb=TINY_MB, accumulate=k).setup(model)
            ref_opt = optimizers.MomentumSGD(lr=0.1).setup(ref)
            with dist.join(opt) as joined:
                for step in range(r + 1):
                    for j in range(k):
                        joined.update(lambda: F.mean_squared_error(
                            model(xs[step, r, j]), ts[step, r, j]))
            assert opt.t == n, (opt.t, overlap)
            for step in (n, n + 1):
                for j in range(k):
                    opt.update(lambda: F.mean_squared_error(
                        model(xs[step, r, j]), ts[step, r, j]))
            for step in range(n + 2):  # ranks step, ..., n - 1 have data
                ranks = slice(step, None) if step < n else slice(None)
                x = xs[step, ranks].reshape(-1, 5)
                t = ts[step, ranks].reshape(-1, 3)
                ref_opt.update(lambda: F.mean_squared_error(ref(x), t))
            _close([p.array for p in model.params()],
                   [p.array for p in ref.params()], 1e-10,
                   ('join with accumulate', overlap))
            if overlap:
                assert opt.reducer.launched_in_backward > 0


def overlap_options_refused(comm):
    def make(c, **kw):
        return dist.create_multi_node_optimizer(optimizers.SGD(), c, **kw)
    naive = dist.create_communicator('naive')
    try:
        _expect_error(ValueError, lambda: make(naive, overlap=True),
                      'naive', 'cannot overlap')
    finally:
        naive.finalize()
    _expect_error(ValueError, lambda: dist.create_communicator(
        'naive', overlap=True), 'cannot overlap')
    _expect_error(ValueError, lambda: make(comm, accumulate=0), 'accumulate')
    _expect_error(ValueError, lambda: make(comm, double_buffering=True,
                                           overlap=True), 'double_buffering')
    model = M.seeded(M.MLP, 0)
    _expect_error(ValueError, lambda: make(comm, overlap=True,
                                           bucket_mb=0).setup(model),
                  'bucket_mb')
    overlapping = dist.create_communicator('flat', overlap=True,
                                           bucket_mb=TINY_MB)
    try:
        opt = make(overlapping).setup(model)
        assert opt.reducer is not None
        assert opt.reducer.bucket_bytes == int(TINY_MB * (1 << 20))
    finally:
        overlapping.finalize()


def overlap_timeline_events(comm):
    # Every rank's trace of one overlapped step: one 'grad' instant per
    # parameter, one 'ready' and one 'bucket' span per bucket, the k-th
    # bucket launched after k + 1 buckets were ready (in order), the first
    # one inside backward, and the 'wait' for the rest after backward.
    import json
    import shutil
    import tempfile
    from minichain.dist.trace import timeline
    model = M.seeded(M.ConvNet, 1)
    opt = dist.create_multi_node_optimizer(
        optimizers.SGD(lr=0.1), comm, **OVERLAP).setup(model)
    x, t = _data(n=2)
    for _ in range(2):  # the broadcast, then the step that records the order
        opt.update(lambda: F.softmax_cross_entropy(model(x), t))
    folder = comm.bcast_obj(tempfile.mkdtemp() if comm.rank == 0 else None)
    path = folder + '/overlap.json'
    with timeline.record(path, comm, out=None):
        opt.update(lambda: F.softmax_cross_entropy(model(x), t))
    n = len(opt.reducer.plan.buckets)
    if comm.rank == 0:
        with open(path) as f:
            events = json.load(f)['traceEvents']
        for r in range(comm.size):
            mine = [e for e in events if e['ph'] == 'X' and e['pid'] == r]

            def at(name):
                return sorted(e['ts'] for e in mine if e['name'] == name)
            assert len(at('grad')) == len(list(model.params())), r
            ready, launch = at('ready'), at('bucket')
            assert len(ready) == len(launch) == n > 2, (r, n)
            assert all(a <= b for a, b in zip(ready, launch)), r
            backward = [e for e in mine if e['name'] == 'backward'][0]
            assert launch[0] < backward['ts'] + backward['dur'], r
            assert at('wait')[0] >= backward['ts'] + backward['dur'], r
        shutil.rmtree(folder)
    comm.mpi_comm.Barrier()
