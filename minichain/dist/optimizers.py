"""create_multi_node_optimizer: make any optimizer data-parallel.

After each backward pass the wrapper averages the gradients over ranks, then
steps the wrapped optimizer. How it averages is an
:class:`~minichain.dist.averaging.base.Averaging` (after backward, during
it, or during the next step; see :mod:`minichain.dist.averaging`).
"""
from minichain.dist.averaging.accumulate import Accumulate
from minichain.dist.averaging.after_backward import AfterBackward
from minichain.dist.averaging.double_buffered import DoubleBuffered
from minichain.dist.averaging.finite import (  # noqa: F401 (public here too)
    CheckFinite, NonFiniteGradientError, all_finite)
from minichain.dist.averaging.overlap import Overlapped
from minichain.dist.averaging.sharded import Sharded
from minichain.dist.trace import timeline


class MultiNodeOptimizer:
    """Wraps an optimizer: average gradients over ranks (``averaging``),
    then step (``actual_optimizer``); ``needs_broadcast``: the next update
    broadcasts rank 0's parameters instead.

    Everything not defined here (``lr``, ``t``, ``target``, ``add_hook``,
    ``serialize``...) reads and writes the wrapped optimizer.
    """

    def __init__(self, actual_optimizer, communicator, averaging):
        # In __dict__: any other name set on the wrapper is set on the
        # wrapped optimizer (__setattr__, at the end of the class).
        self.__dict__.update(actual_optimizer=actual_optimizer,
                             communicator=communicator, averaging=averaging,
                             needs_broadcast=True)

    def update(self, lossfun=None, *args, **kwds):
        """One data-parallel step, or one of its ``accumulate`` backward
        passes.

        With ``lossfun``, ``lossfun(*args, **kwds).backward()`` computes
        this rank's gradients first (the gradients are cleared before the
        first pass of a step). The first call after ``setup`` only
        broadcasts rank 0's parameters and persistents (no step: the
        gradients were taken at the old values). After that, every
        ``accumulate``-th call averages the gradients over ranks (and over
        the passes) and steps; the calls between only accumulate.
        """
        target = self._target('update')
        if lossfun is not None:
            self._forward_backward(target, lossfun, args, kwds)
        try:
            if self.needs_broadcast:
                self.averaging.discard()
                self.communicator.bcast_data(target)
                self.needs_broadcast = False
            elif self.averaging.average(target):
                with timeline.span('update', sync=target.device_id >= 0):
                    self.averaging.step(self.actual_optimizer, *args, **kwds)
                self.averaging.stepped(target)
        finally:  # also after an error that a training loop may survive
            self.averaging.prepare()  # for the next backward pass

    def setup(self, link):
        """Set up the wrapped optimizer on ``link`` (with overlap, hook its
        parameters); the next update broadcasts rank 0's parameters.
        Returns self."""
        self.actual_optimizer.setup(link)
        self.averaging.setup(link)
        self.averaging.prepare()
        self.needs_broadcast = True
        return self

    def broadcast_params(self):
        """Broadcast rank 0's parameters and persistents now, so that the
        first ``update`` steps instead of broadcasting (a script that
        counts its updates, or whose first batch matters, wants every one
        to step). Collective: every rank calls it, after ``setup`` and once
        every parameter is initialized (a lazy layer after a forward pass).
        Returns self."""
        self.communicator.bcast_data(self._target('broadcast_params'))
        self.needs_broadcast = False
        return self

    def gathered_state(self):
        """A context in which every parameter's update rule holds its whole
        state, as without sharding (``shard_state=True`` gathers every
        rank's shard: collective, on every rank; otherwise nothing to do).
        ``multi_node_snapshot`` saves inside it."""
        return self.averaging.gathered_state(self._target('gathered_state'))

    def serialize(self, serializer):
        """Save or load the wrapped optimizer (with ``shard_state``: saving
        inside :meth:`gathered_state`; loading gives each rank its shard of
        the whole state saved, on any number of ranks)."""
        self.averaging.serialize(self.actual_optimizer, serializer)

    @property
    def reducer(self):
        """The overlap's Reducer (``overlap=True``, after ``setup``), else
        None."""
        return self.averaging.reducer

    def _target(self, where):
        """The wrapped optimizer's link; RuntimeError before ``setup``
        (the same on every rank: nothing was communicated yet)."""
        target = self.actual_optimizer.target
        if target is None:
            raise RuntimeError(
                'multi-node optimizer ({}).{}: call setup(link) first'
                .format(type(self.actual_optimizer).__name__, where))
        return target

    def _forward_backward(self, target, lossfun, args, kwds):
        if self.averaging.starts_step:
            target.cleargrads()
        on_gpu = target.device_id >= 0
        with timeline.span('forward', sync=on_gpu):
            loss = lossfun(*args, **kwds)
        scale = getattr(self.actual_optimizer, 'loss_scale', None)
        with timeline.span('backward', sync=on_gpu):
            (loss if scale is None else loss * scale).backward()

    # The wrapper stands in for the optimizer: a name it does not keep in
    # its own __dict__ is the wrapped optimizer's.
    def __getattr__(self, name):
        actual = self.__dict__.get('actual_optimizer')
        if actual is None or name.startswith('__'):  # e.g. while unpickling
            raise AttributeError(name)
        return getattr(actual, name)

    def __setattr__(self, name, value):
        if name in self.__dict__:
            self.__dict__[name] = value
        else:
            setattr(self.actual_optimizer, name, value)

    def __repr__(self):
        return 'MultiNode({!r}, {!r})'.format(self.actual_optimizer,
                                              self.communicator)


def create_multi_node_optimizer(actual_optimizer, communicator,
                                double_buffering=False, zero_fill=True,
                                nan_check=True, overlap=None, bucket_mb=None,
                                accumulate=1, shard_state=False):
    """Wrap ``actual_optimizer`` for synchronous data-parallel training.

    The contract, on every rank:

    * every rank builds the same model (same parameter paths, shapes and
      dtypes: checked before each allreduce, a mismatch raises on every
      rank) and calls ``update`` the same number of times (for shards of
      different lengths see :func:`join`);
    * the first ``update`` after ``setup`` broadcasts rank 0's parameters
      and persistents and does not step (``broadcast_params()`` does it
      before the first update instead); every later one replaces each
      gradient by its mean over ranks (parameters in sorted-path order),
      then steps the wrapped optimizer. Gradients are **averaged**: with a
      per-rank mean loss over equal local batches this equals one process
      on the whole batch; a summed loss is scaled by ``1 / size``;
    * batch-norm statistics stay per rank unless the model uses
      ``MultiNodeBatchNormalization`` (see ``create_mnbn_model``);
    * with ``nan_check`` a non-finite averaged gradient skips the update
      and raises :class:`NonFiniteGradientError` on every rank, naming the
      ranks whose own gradient was not finite; with dynamic loss scaling
      (``loss_scaling()``, mixed16) it skips the update and halves the
      scale on every rank instead, with no message added: the inf or NaN
      of one rank travels in the average to all (not with
      ``shard_state``). No message is added: a
      non-finite value on any rank is non-finite in the sum on every rank,
      so each rank checks its averaged gradient (one reduction per
      parameter; on the GPU one read of one value, which waits for the
      step's kernels), and only on that error path do the ranks compare.

    Example::

        comm = dist.create_communicator('flat')
        opt = dist.create_multi_node_optimizer(
            optimizers.MomentumSGD(lr=0.1), comm).setup(model)
        for x, t in batches:           # this rank's shard
            opt.update(lossfun, x, t)

    Args:
        actual_optimizer: any minichain optimizer (not yet set up, or set
            up: call ``setup`` on the wrapper either way).
        communicator: a minichain.dist communicator.
        double_buffering: GPU and pure_nccl only: overlap each allreduce
            with the next iteration, applying one-step-stale gradients.
        zero_fill: a gradient that is None on some ranks only is averaged
            as zeros there (else that case raises on every rank).
        nan_check: check the averaged gradient for inf/NaN before each
            step (see above; not with ``double_buffering``).
        overlap: average the gradients in buckets while backward still
            runs (:mod:`minichain.dist.averaging.overlap`; flat, pure_nccl and
            hierarchical). The result is the same as without; the first
            averaging after ``setup`` records the order of the buckets and
            only sends them after backward. None: the communicator's
            ``overlap`` (``create_communicator(..., overlap=True)``).
        bucket_mb: the buckets' size in MiB with ``overlap`` (None: the
            communicator's ``bucket_mb``, else 25 as DDP; the first bucket
            holds about 1 MiB).
        accumulate: backward passes per step (DDP's ``no_sync``,
            Horovod's ``backward_passes_per_step``): each ``update`` runs
            one (a micro-batch) and only every ``accumulate``-th averages
            (the mean over ranks and passes: with mean losses over equal
            micro-batches, one step on the ``accumulate`` times larger
            batch) and steps; the others only accumulate gradients, without
            communicating. Batch-norm statistics are those of each
            micro-batch.
        shard_state: keep 1/N of the optimizer state per rank (ZeRO
            stage 1; :mod:`minichain.dist.averaging.sharded`): gradients
            reduce-scattered, each rank steps its contiguous 1/N of the
            packed parameters, parameters allgathered. The same training;
            ``param.grad`` is None after an update (released once packed:
            no rank holds the whole mean); rules that are not elementwise
            are refused; save inside ``gathered_state()``. Not with
            ``overlap``, ``double_buffering``, ``accumulate`` or ``join``;
            MPI communicators, ring and pure_nccl.
    Returns:
        The wrapper; everything it does not define is the wrapped
        optimizer's (``opt.lr``, ``opt.t``, ``opt.serialize``...).
    Raises:
        ValueError: an option this communicator cannot do, ``accumulate``
            below 1, or ``double_buffering`` with ``overlap`` or
            ``accumulate``.
    """
    if overlap is None:
        overlap = getattr(communicator, 'overlap', False)
    if bucket_mb is None:
        bucket_mb = getattr(communicator, 'bucket_mb', None)
    if not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError('create_multi_node_optimizer: accumulate must be an '
                         'integer >= 1, got {!r}'.format(accumulate))
    if shard_state:
        others = [name for name, on in (('overlap', overlap),
                  ('double_buffering', double_buffering),
                  ('accumulate > 1', accumulate > 1)) if on]
        if others:
            raise ValueError('create_multi_node_optimizer: shard_state cannot '
                             'be combined with {}'.format(', '.join(others)))
        if not hasattr(communicator, 'reduce_scatter'):
            raise ValueError('create_multi_node_optimizer: the {} '
                             'communicator cannot shard the optimizer state'
                             .format(communicator.name))
        averaging = Sharded(communicator, actual_optimizer, zero_fill)
        if nan_check:
            averaging = CheckFinite(averaging, communicator,
                                    lambda: actual_optimizer.t)
        return MultiNodeOptimizer(actual_optimizer, communicator, averaging)
    if double_buffering:
        if overlap or accumulate > 1:
            raise ValueError('create_multi_node_optimizer: double_buffering '
                             'cannot be combined with overlap or accumulate')
        return MultiNodeOptimizer(actual_optimizer, communicator,
                                  DoubleBuffered(communicator, zero_fill))
    if overlap and not getattr(communicator, 'can_overlap', False):
        raise ValueError('create_multi_node_optimizer: the {} communicator '
                         'cannot overlap (use flat, pure_nccl or '
                         'hierarchical)'.format(communicator.name))

    def step_count():
        return actual_optimizer.t
    if overlap:
        averaging = Overlapped(communicator, zero_fill, step_count,
                               accumulate, bucket_mb)
    else:
        averaging = AfterBackward(communicator, zero_fill, step_count,
                                  accumulate)
    if nan_check:
        averaging = CheckFinite(averaging, communicator, step_count,
                                lambda: getattr(actual_optimizer,
                                                'dynamic_loss_scaling', False))
    if accumulate > 1:
        averaging = Accumulate(averaging)
    return MultiNodeOptimizer(actual_optimizer, communicator, averaging)
