"""Equivalence testing for users: data-parallel training == one process.

Call :func:`assert_data_parallel_equivalent` inside your own test, run under
``mpiexec -n K``. It proves that your model, loss and optimizer train the
same on K ranks as on one process with the whole batch, which catches a
model that is not the same on every rank, per-rank batch statistics, a loss
that is summed instead of averaged, randomness that differs between ranks...
"""
import numpy

from minichain import backend
from minichain import functions as F
from minichain.configuration import no_backprop_mode, using_config
from minichain.dist.batch_normalization import MultiNodeBatchNormalization
from minichain.dist.datasets import shard_bounds
from minichain.dist.optimizers import create_multi_node_optimizer
from minichain.links import BatchNormalization

_MAX_LINES = 20


def default_lossfun(model, x, t):
    """Softmax cross entropy for integer targets, else mean squared error."""
    y = model(x)
    if backend.to_cpu(t).dtype.kind in 'iu':
        return F.softmax_cross_entropy(y, t)
    return F.mean_squared_error(y, t)


def _default_optimizer():
    from minichain.optimizers import MomentumSGD
    return MomentumSGD(lr=0.1, momentum=0.9)


def _to_local_bn(model):
    # The single-process reference normalizes its (full) batch by itself:
    # that is exactly what the synchronized layer emulates across ranks.
    for _, link in model.namedlinks():
        if isinstance(link, MultiNodeBatchNormalization):
            link.__class__ = BatchNormalization
            del link.__dict__['comm']
    return model


def _compare_group(pairs, rank, rtol, atol, out):
    """Compare ``[(what, got, want)]``; errors are measured against the
    largest ``|want|`` of the whole group (all gradients of a step, all
    parameters): a gradient that is zero up to roundoff (a bias followed by
    batch normalization) then does not fail on noise."""
    pairs = [(what, backend.to_cpu(got).astype(numpy.float64),
              backend.to_cpu(want).astype(numpy.float64))
             for what, got, want in pairs]
    scale = max([float(numpy.abs(w).max()) for _, _, w in pairs if w.size]
                + [0.0])
    tol = atol + rtol * scale
    for what, got, want in pairs:
        if got.shape != want.shape:
            out.append('{} on rank {}: shape {} vs single-process {}'.format(
                what, rank, got.shape, want.shape))
            continue
        if got.size == 0:
            continue
        err = numpy.where(numpy.isfinite(got), numpy.abs(got - want),
                          numpy.inf)
        if float(err.max()) > tol:
            worst = numpy.unravel_index(numpy.argmax(err), err.shape)
            out.append(
                '{} on rank {}: worst element {}: data-parallel {!r} vs '
                'single-process {!r} (|diff| {:.3g} > {:.3g} = atol {} + rtol '
                '{} * largest |single-process| value {:.3g})'.format(
                    what, rank, tuple(int(i) for i in worst),
                    float(got[worst]), float(want[worst]), float(err[worst]),
                    tol, atol, rtol, scale))


def assert_data_parallel_equivalent(make_model, x, t, comm, lossfun=None,
                                    steps=1, make_optimizer=None,
                                    local_sizes=None, rtol=None, atol=0.0,
                                    check_persistents=True):
    """Assert that data-parallel training equals one process on the batch.

    Every rank trains two copies of ``make_model()`` from the same start
    (rank 0's initial values): a reference on the whole batch ``(x, t)``
    with a plain optimizer, and a data-parallel one on its shard through
    ``create_multi_node_optimizer`` (each shard's mean loss weighted by
    ``size * n_local / N``, so unequal shards average correctly). In the
    reference every ``MultiNodeBatchNormalization`` acts as a per-process
    ``L.BatchNormalization`` (on the whole batch, which is what the
    synchronized layer emulates). After every step the averaged gradients
    are compared; after the last, the parameters and persistents.

    Args:
        make_model: callable returning a fresh Link (the same architecture
            on every rank; initial values may differ, rank 0's are used).
        x, t: the whole batch (rank 0's values are broadcast).
        comm: a minichain.dist communicator.
        lossfun: ``lossfun(model, x, t)`` -> scalar mean loss over the
            batch; default :func:`default_lossfun`.
        steps: number of optimizer updates.
        make_optimizer: callable returning a fresh optimizer; default
            ``MomentumSGD(lr=0.1, momentum=0.9)``.
        local_sizes: examples per rank (sum ``len(x)``, each >= 1); default
            as even as possible, in rank order.
        rtol, atol: every element must satisfy ``|dp - ref| <= atol +
            rtol * M``, with M the largest ``|ref|`` among all gradients
            of that step (resp. all parameters, all persistents), so that
            gradients that are zero up to roundoff do not fail on noise;
            rtol defaults to 1e-10 for float64 data, 1e-4 otherwise.
        check_persistents: also compare persistents (running statistics).
    Raises:
        AssertionError: on every rank, naming each step, parameter, rank
            and worst element that differ.
    """
    lossfun = lossfun or default_lossfun
    make_optimizer = make_optimizer or _default_optimizer
    x, t = comm.bcast(x), comm.bcast(t)
    n, size, rank = len(x), comm.size, comm.rank
    if local_sizes is None:
        local_sizes = [b - a for a, b in shard_bounds(n, size, False)]
    if len(local_sizes) != size or sum(local_sizes) != n or min(
            local_sizes) < 1:
        raise ValueError('assert_data_parallel_equivalent: local_sizes {} '
                         'must hold {} positive sizes summing to len(x) = {}'
                         .format(list(local_sizes), size, n))
    if rtol is None:
        rtol = 1e-10 if x.dtype == numpy.float64 else 1e-4
    start = sum(local_sizes[:rank])
    xs, ts = x[start:start + local_sizes[rank]], t[start:start + local_sizes[
        rank]]
    weight = size * local_sizes[rank] / n

    ref, dp = _to_local_bn(make_model()), make_model()
    with using_config('train', False), no_backprop_mode():
        for model in (ref, dp):
            if any(p.array is None for p in model.params()):
                model(x[:1])  # lazy initialization (no communication)
    dp_opt = create_multi_node_optimizer(make_optimizer(), comm).setup(dp)
    dp_opt.update()  # broadcasts rank 0's parameters and persistents
    ref.copyparams(dp)
    ref_opt = make_optimizer().setup(ref)

    failures = []
    for step in range(1, steps + 1):
        ref_opt.update(lambda: lossfun(ref, x, t))
        dp_opt.update(lambda: lossfun(dp, xs, ts) * weight)
        pairs = []
        for (name, pr), (_, pd) in zip(ref.namedparams(), dp.namedparams()):
            if pr.grad is None and pd.grad is None:
                continue
            if (pr.grad is None) != (pd.grad is None):
                failures.append('step {}, gradient of {} on rank {}: None on '
                                'one side only'.format(step, name, rank))
                continue
            pairs.append(('step {}, gradient of {}'.format(step, name),
                          pd.grad, pr.grad))
        _compare_group(pairs, rank, rtol, atol, failures)
    _compare_group([('parameter {} after {} steps'.format(name, steps),
                     pd.array, pr.array) for (name, pr), (_, pd) in
                    zip(ref.namedparams(), dp.namedparams())],
                   rank, rtol, atol, failures)
    if check_persistents:
        pairs = []
        for (name, vr), (_, vd) in zip(ref.namedpersistents(),
                                       dp.namedpersistents()):
            if backend.is_array(vr):
                pairs.append(('persistent {} after {} steps'.format(
                    name, steps), vd, vr))
            elif vr != vd:
                failures.append('persistent {} on rank {}: {!r} vs {!r}'
                                .format(name, rank, vd, vr))
        _compare_group(pairs, rank, rtol, atol, failures)
    every = [line for lines in comm.allgather_obj(failures) for line in lines]
    if every:
        shown = every[:_MAX_LINES]
        more = len(every) - len(shown)
        raise AssertionError(
            'assert_data_parallel_equivalent: data-parallel training on {} '
            'ranks differs from one process ({} mismatches):\n  {}{}'.format(
                size, len(every), '\n  '.join(shown),
                '\n  ... and {} more'.format(more) if more else ''))
