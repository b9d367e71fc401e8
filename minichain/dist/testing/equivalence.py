"""Equivalence testing for users: data-parallel training == one process.

Call :func:`assert_data_parallel_equivalent` inside your own test on K >= 2
ranks: mark the test ``@pytest.mark.mpi(ranks=[2, 3])`` and plain ``pytest``
runs it under ``mpiexec -n 2`` and ``-n 3``
(:mod:`minichain.dist.testing.pytest_plugin`, docs/testing.md). It proves that
your model, loss and optimizer train the same on K ranks as on one process
with the whole batch, which catches a model that is not the same on every
rank, per-rank batch statistics, a loss that is summed instead of averaged,
randomness that differs between ranks...
On one rank it raises instead of passing: one process compared with itself
proves nothing.
"""
import numpy

from minichain import backend
from minichain import functions as F
from minichain.configuration import (config, is_mixed16, no_backprop_mode,
                                     using_config)
from minichain.dist.batch_normalization import MultiNodeBatchNormalization
from minichain.dist.datasets import shard_bounds
from minichain.dist.optimizers import create_multi_node_optimizer
from minichain.gradient_check import BF16_RTOL

_MAX_LINES = 20

# The options of create_multi_node_optimizer that the single-process
# reference knows how to follow: for each, the number of updates by which
# the applied gradient lags (double buffering applies the previous step's
# gradients; overlap changes when gradients travel, not what is applied;
# accumulate is followed by accumulating the same micro-batches). An option
# missing here is refused rather than compared against a reference that
# ignores it.
_LAG_OF_OPTION = {'zero_fill': 0, 'nan_check': 0, 'double_buffering': 1,
                  'overlap': 0, 'bucket_mb': 0, 'accumulate': 0,
                  'shard_state': 0}


class NotEnoughRanksError(ValueError):
    """An equivalence check was called on fewer than two ranks."""


def require_ranks(comm, where):
    """Raise :class:`NotEnoughRanksError` unless ``comm`` has two ranks or
    more; the message says how to run the test on more ranks. Every
    equivalence check starts with it."""
    __tracebackhide__ = True
    if comm.size >= 2:
        return
    raise NotEnoughRanksError(
        '{}: the communicator has {} rank, so the data-parallel run would be '
        'compared with itself and pass whatever the model does. Run the test '
        'on 2 or more ranks: mark it @pytest.mark.mpi(ranks=[2, 3]) '
        '(minichain\'s pytest plugin then runs it under mpiexec -n 2 and '
        '-n 3 from plain pytest; see docs/testing.md), or start the tests '
        'yourself: mpiexec -n 2 python -m pytest ...'.format(where, comm.size))


def default_lossfun(model, x, t):
    """Softmax cross entropy for integer targets, else mean squared error."""
    y = model(x)
    if backend.to_cpu(t).dtype.kind in 'iu':
        return F.softmax_cross_entropy(y, t)
    return F.mean_squared_error(y, t)


def _default_optimizer():
    from minichain.optimizers import MomentumSGD
    return MomentumSGD(lr=0.1, momentum=0.9)


def _one_process_reference(model, comm):
    """Make ``model`` the single-process reference: each synchronized batch
    normalization gets a communicator of this process alone, so it
    normalizes the whole batch on its own, which is what the data-parallel
    layers together emulate. Returns that communicator (to free)."""
    alone = comm.split(comm.rank, 0)
    for _, link in model.namedlinks():
        if isinstance(link, MultiNodeBatchNormalization):
            link.comm = alone
    return alone


def _compare_group(pairs, rank, rtol, atol, out, floor=0.0, ratio_of=None):
    """Compare ``[(what, got, want)]``; errors are measured against the
    largest ``|want|`` of the whole group (all gradients of a step, all
    parameters), or ``floor`` if larger: a gradient that is zero up to
    roundoff (a bias followed by batch normalization) then does not fail
    on noise. ``ratio_of`` ``(what, size, notes)``: on a mismatch, a line on
    the ratio of the group's values goes to ``notes`` (:func:`_ratio_line`).
    Returns that largest ``|want|``."""
    pairs = [(what, backend.to_cpu(got).astype(numpy.float64),
              backend.to_cpu(want).astype(numpy.float64))
             for what, got, want in pairs]
    largest = max([float(numpy.abs(w).max()) for _, _, w in pairs if w.size]
                  + [0.0])
    scale = max(largest, floor)
    tol = atol + rtol * scale
    first = len(out)
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
    if ratio_of and len(out) > first:
        what, size, notes = ratio_of
        notes.append(_ratio_line(what, size, pairs, tol))
    return largest


# A ratio of the data-parallel gradients to one process's that is the
# number of ranks, or its inverse, has a likely cause.
_CAUSES = (
    (lambda size: size, '{size} = the number of ranks: the gradients are '
     'summed over the ranks, not averaged (an allreduce without the '
     'division by the number of ranks, or a loss multiplied by it)'),
    (lambda size: 1.0 / size, '1/{size} = one over the number of ranks: '
     'most likely the loss is summed over the batch instead of averaged '
     '(each rank\'s sum covers 1/{size} of the examples): return a mean, '
     'as F.softmax_cross_entropy and F.mean_squared_error do'))


def _ratio_line(what, size, pairs, tol):
    """The least-squares ratio of the data-parallel values to the
    single-process ones over a group, whether it explains every element,
    and then the likely cause when it is the number of ranks or its
    inverse."""
    same = [(g.ravel(), w.ravel()) for _, g, w in pairs if g.shape == w.shape]
    got = numpy.concatenate([g for g, _ in same] + [numpy.zeros(0)])
    want = numpy.concatenate([w for _, w in same] + [numpy.zeros(0)])
    norm = float(want @ want)
    if not norm or not numpy.isfinite(got).all():
        return '{}: no ratio to state'.format(what)
    ratio = float(got @ want) / norm
    line = '{}: data-parallel / single-process = {:.6g}'.format(what, ratio)
    if float(numpy.abs(got - ratio * want).max()) > tol:
        return line + ' (least squares; no one ratio fits every element)'
    line += ' for every element'
    for value, cause in _CAUSES:
        if abs(ratio - value(size)) <= 1e-3 * value(size):
            return '{}, which is {}'.format(line, cause.format(size=size))
    return line


def assert_data_parallel_equivalent(make_model, x, t, comm, lossfun=None,
                                    steps=1, make_optimizer=None,
                                    local_sizes=None, rtol=None, atol=0.0,
                                    check_persistents=True,
                                    multi_node_options=None):
    """Assert that data-parallel training equals one process on the batch.

    Every rank trains two copies of ``make_model()`` from the same start
    (rank 0's initial values): a reference on the whole batch ``(x, t)``
    with a plain optimizer, and a data-parallel one on its shard through
    ``create_multi_node_optimizer(..., **multi_node_options)`` (each
    shard's mean loss weighted by ``size * n_local / N``, so unequal shards
    average correctly). In the reference every
    ``MultiNodeBatchNormalization`` is given a communicator of its own
    process alone, so it normalizes the whole batch by itself (what the
    synchronized layers emulate together). After every step the gradients
    that were applied are compared; after the last, the parameters, the
    persistents and the optimizers' step counts.

    With ``double_buffering=True`` in ``multi_node_options`` the reference
    follows the same one-step-stale schedule on one process: update k
    applies the gradient computed at update k - 1, and the first update
    applies nothing. ``steps`` counts applied steps either way (so double
    buffering runs ``steps + 1`` updates). With ``accumulate=k`` each
    rank's shard is cut into k micro-batches, one ``update`` each, and the
    reference accumulates the k global micro-batches (micro-batch j of
    every rank, together) before its step, so that synchronized batch
    normalization normalizes the same examples on both sides. With
    ``overlap=True`` (and ``bucket_mb``) the reference is the plain one:
    overlap changes when gradients travel, not what is applied.

    Args:
        make_model: callable returning a fresh Link (the same architecture
            on every rank; initial values may differ, rank 0's are used).
        x, t: the whole batch (rank 0's values are broadcast).
        comm: a minichain.dist communicator of 2 or more ranks.
        lossfun: ``lossfun(model, x, t)`` -> scalar mean loss over the
            batch; default :func:`default_lossfun`.
        steps: number of optimizer steps.
        make_optimizer: callable returning a fresh optimizer; default
            ``MomentumSGD(lr=0.1, momentum=0.9)``.
        local_sizes: examples per rank (sum ``len(x)``, each >= 1); default
            as even as possible, in rank order.
        rtol, atol: every element must satisfy ``|dp - ref| <= atol +
            rtol * M``, with M the largest ``|ref|`` among all gradients
            of that step and the steps before (resp. all parameters, all
            persistents), so that gradients that are zero up to roundoff,
            or that shrink while the roundoff of the earlier steps' updates
            stays, do not fail on noise;
            rtol defaults to 1e-10 for float64 data, 1e-4 otherwise, and
            ``gradient_check.BF16_RTOL`` (4 * 2^-7, bfloat16's eps) where
            products compute in bfloat16 (``config.fp32_math == 'bf16'``
            or ``config.dtype == 'mixed16'``): a float32 difference in the
            order of a sum (the shards' against the whole batch's) flips a
            bfloat16 rounding downstream, which moves that product by eps,
            and batch normalization's backward and the updates carry it
            on (measured: up to 2.5 eps at 3 ranks, 3 steps, over 6 seeds
            of tests/dist/test_precision.py's model).
        check_persistents: also compare persistents (running statistics).
        multi_node_options: keyword arguments of
            ``create_multi_node_optimizer`` (``double_buffering``,
            ``zero_fill``, ``nan_check``, ``overlap``, ``bucket_mb``,
            ``accumulate``, ``shard_state``: the parameters are then
            compared after every step instead of the gradients, which no
            rank holds whole); one the reference cannot follow is refused.
    Raises:
        NotEnoughRanksError: ``comm`` has a single rank (a ValueError).
        ValueError: bad ``local_sizes`` or an unknown option.
        AssertionError: on every rank, naming each step, parameter, rank
            and worst element that differ, led by the ratio of the
            gradients of each step that differs (and its likely cause when
            it is the number of ranks or its inverse: gradients summed
            over the ranks, or a loss summed over the batch).
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
    options = dict(multi_node_options or {})
    unknown = sorted(set(options) - set(_LAG_OF_OPTION))
    if unknown:
        raise ValueError('assert_data_parallel_equivalent: the reference '
                         'cannot follow multi_node_options {} (known: {})'
                         .format(unknown, sorted(_LAG_OF_OPTION)))
    require_ranks(comm, 'assert_data_parallel_equivalent')
    lag = max([_LAG_OF_OPTION[k] for k, v in options.items() if v] + [0])
    micro = options.get('accumulate', 1)
    lossfun = lossfun or default_lossfun
    make_optimizer = make_optimizer or _default_optimizer
    x, t = comm.bcast(x), comm.bcast(t)
    n, size, rank = len(x), comm.size, comm.rank
    if local_sizes is None:
        local_sizes = [b - a for a, b in shard_bounds(n, size, False)]
    if len(local_sizes) != size or sum(local_sizes) != n or min(
            local_sizes) < max(1, micro):
        raise ValueError('assert_data_parallel_equivalent: local_sizes {} '
                         'must hold {} sizes of at least {} (accumulate) '
                         'summing to len(x) = {}'.format(
                             list(local_sizes), size, max(1, micro), n))
    if rtol is None:
        rtol = (1e-10 if x.dtype == numpy.float64 else
                BF16_RTOL if config.fp32_math == 'bf16'
                or is_mixed16(config.dtype) else 1e-4)
    mine, whole = _micro_batches(local_sizes, micro, rank)

    ref, dp = make_model(), make_model()
    alone = _one_process_reference(ref, comm)
    try:
        with using_config('train', False), no_backprop_mode():
            for model in (ref, dp):
                if any(p.array is None for p in model.params()):
                    model(x[:1])  # lazy initialization (no communication)
        dp_opt = create_multi_node_optimizer(make_optimizer(), comm,
                                             **options).setup(dp)
        dp_opt.update()  # broadcasts rank 0's parameters and persistents
        ref.copyparams(dp)
        ref_opt = _LaggedOptimizer(make_optimizer().setup(ref), lag)
        failures, notes = [], []  # notes: what the failures suggest
        largest = 0.0   # the largest gradient so far (the scale of errors)

        def ref_loss():  # the global micro-batches, each by its share
            return sum(lossfun(ref, x[i], t[i]) * (len(i) / n) for i in whole)
        for call in range(1, steps + lag + 1):
            stepped = ref_opt.update(ref_loss)
            for i in mine:  # weighted so that the mean over all is right
                dp_opt.update(lambda: lossfun(dp, x[i], t[i]) * (
                    size * micro * len(i) / n))
            if stepped and options.get('shard_state'):
                # no rank holds the whole averaged gradient: compare what
                # the step made of it, after every step
                _compare_group([('step {}, parameter {}'.format(
                    call, name), pd.array, pr.array) for (name, pr), (_, pd)
                    in zip(ref.namedparams(), dp.namedparams())],
                    rank, rtol, atol, failures)
            elif stepped:
                largest = max(largest, _compare_gradients(
                    ref, dp, call - lag, size, rank, rtol, atol, failures,
                    notes, largest))
        _compare_state(ref, dp, steps, rank, rtol, atol, check_persistents,
                       failures)
        if dp_opt.t != ref_opt.optimizer.t:
            failures.append('step count on rank {}: the data-parallel '
                            'optimizer took {} steps, the single-process one '
                            '{}'.format(rank, dp_opt.t, ref_opt.optimizer.t))
    finally:
        alone.finalize()
    everyone = comm.allgather_obj((failures, notes))
    every = [line for lines, _ in everyone for line in lines]
    if every:
        shown = list(dict.fromkeys(n for _, ns in everyone for n in ns)) + \
            every[:_MAX_LINES]
        more = len(every) - _MAX_LINES
        raise AssertionError(
            'assert_data_parallel_equivalent: data-parallel training on {} '
            'ranks differs from one process ({} mismatches):\n  {}{}'.format(
                size, len(every), '\n  '.join(shown),
                '\n  ... and {} more'.format(more) if more > 0 else ''))


def _micro_batches(local_sizes, k, rank):
    """Indexes into the whole batch: ``rank``'s k micro-batches (its shard
    cut as evenly as possible), and the k global ones (micro-batch j of
    every rank, in rank order)."""
    starts = numpy.cumsum([0] + list(local_sizes))
    parts = [[numpy.arange(starts[r] + a, starts[r] + b) for a, b in
              shard_bounds(local_sizes[r], k, False)]
             for r in range(len(local_sizes))]
    return parts[rank], [numpy.concatenate([p[j] for p in parts])
                         for j in range(k)]


class _LaggedOptimizer:
    """A plain optimizer on one process that applies, at each update, the
    gradient computed ``lag`` updates before (0: at once, as usual)."""

    def __init__(self, optimizer, lag):
        self.optimizer, self.lag, self.pending = optimizer, lag, []

    def update(self, lossfun):
        """Compute this update's gradient; apply the one due now. Returns
        whether a step was taken."""
        if not self.lag:
            self.optimizer.update(lossfun)
            return True
        target = self.optimizer.target
        target.cleargrads()
        lossfun().backward()
        self.pending.append([p.grad for p in target.params()])
        if len(self.pending) <= self.lag:
            return False
        for p, g in zip(target.params(), self.pending.pop(0)):
            p.grad = g
        self.optimizer.update()
        return True


def _compare_gradients(ref, dp, step, size, rank, rtol, atol, failures,
                       notes, floor):
    pairs = []
    for (name, pr), (_, pd) in zip(ref.namedparams(), dp.namedparams()):
        if pr.grad is None and pd.grad is None:
            continue
        if (pr.grad is None) != (pd.grad is None):
            failures.append('step {}, gradient of {} on rank {}: None on one '
                            'side only'.format(step, name, rank))
            continue
        pairs.append(('step {}, gradient of {}'.format(step, name), pd.grad,
                      pr.grad))
    return _compare_group(pairs, rank, rtol, atol, failures, floor,
                          ('step {}, the gradients'.format(step), size, notes))


def _compare_state(ref, dp, steps, rank, rtol, atol, check_persistents,
                   failures):
    _compare_group([('parameter {} after {} steps'.format(name, steps),
                     pd.array, pr.array) for (name, pr), (_, pd) in
                    zip(ref.namedparams(), dp.namedparams())],
                   rank, rtol, atol, failures)
    if not check_persistents:
        return
    pairs = []
    for (name, vr), (_, vd) in zip(ref.namedpersistents(),
                                   dp.namedpersistents()):
        if backend.is_array(vr):
            pairs.append(('persistent {} after {} steps'.format(name, steps),
                          vd, vr))
        elif vr != vd:
            failures.append('persistent {} on rank {}: {!r} vs {!r}'.format(
                name, rank, vd, vr))
    _compare_group(pairs, rank, rtol, atol, failures)
