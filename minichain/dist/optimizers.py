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
from minichain.dist import hooks


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
        with hooks.span('forward', sync=on_gpu):
            loss = lossfun(*args, **kwds)
        scale = getattr(self.actual_optimizer, 'loss_scale', None)
        with hooks.span('backward', sync=on_gpu):
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

    The contract, on every rank: the same model (paths, shapes, dtypes;
    with the guards a mismatch raises on every rank) and the same number of
    ``update`` calls (see :func:`join` for shards of different lengths).
    The first ``update`` after ``setup`` broadcasts rank 0's parameters and
    persistents and does not step (``broadcast_params()`` does it at once);
    every later one replaces each gradient by its **mean** over ranks, then
    steps: with a per-rank mean loss over equal batches, one process on the
    whole batch. Batch-norm statistics stay per rank unless the model uses
    ``MultiNodeBatchNormalization``. Example::

        opt = dist.create_multi_node_optimizer(
            optimizers.MomentumSGD(lr=0.1), comm).setup(model)
        for x, t in batches:           # this rank's shard
            opt.update(lossfun, x, t)

    Args:
        actual_optimizer: any minichain optimizer.
        communicator: a minichain.dist communicator.
        double_buffering: pure_nccl only: each allreduce overlaps the next
            iteration, which applies one-step-stale gradients.
        zero_fill: a gradient None on some ranks only counts as zeros there
            (else it raises on every rank).
        nan_check: a non-finite averaged gradient skips the step and raises
            :class:`NonFiniteGradientError` on every rank, naming the ranks
            whose own gradient was not finite (averaging/finite.py); with
            dynamic loss scaling (``loss_scaling()``, mixed16) the optimizer
            skips the step and halves the scale on every rank instead, with
            no message added (one rank's inf travels in the average).
        overlap: average in buckets while backward runs
            (averaging/overlap.py; the same result). None: the
            communicator's ``overlap``.
        bucket_mb: the buckets' size in MiB (None: the communicator's, else
            25 as DDP; the first holds about 1 MiB).
        accumulate: backward passes per step (DDP's ``no_sync``): only every
            ``accumulate``-th ``update`` averages (over ranks and passes) and
            steps; the others accumulate without communicating.
        shard_state: keep 1/N of the optimizer state per rank (ZeRO stage
            1, averaging/sharded.py): gradients reduce-scattered, each rank
            steps its 1/N of the packed parameters, which are allgathered;
            ``param.grad`` is None after an update; save inside
            ``gathered_state()``. Elementwise rules only.
    Returns:
        The wrapper; what it does not define is the wrapped optimizer's.
    Raises:
        ValueError: an option the communicator cannot do, ``accumulate``
            below 1, or options that exclude each other (``shard_state``
            or ``double_buffering`` with ``overlap`` or ``accumulate``).
    """
    if overlap is None:  # (a stand-in communicator may have neither)
        overlap = getattr(communicator, 'overlap', False)
    if bucket_mb is None:
        bucket_mb = getattr(communicator, 'bucket_mb', None)
    if not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError('create_multi_node_optimizer: accumulate must be an '
                         'integer >= 1, got {!r}'.format(accumulate))
    chosen = [name for name, on in (
        ('shard_state', shard_state), ('double_buffering', double_buffering),
        ('overlap', overlap), ('accumulate > 1', accumulate > 1)) if on]
    if chosen[0:1] in (['shard_state'], ['double_buffering']) and chosen[1:]:
        raise ValueError('create_multi_node_optimizer: {} cannot be combined '
                         'with {}'.format(chosen[0], ', '.join(chosen[1:])))
    if overlap and not getattr(communicator, 'can_overlap', False):
        raise ValueError('create_multi_node_optimizer: the {} communicator '
                         'cannot overlap (use flat, ring, pure_nccl or '
                         'hierarchical)'.format(communicator.name))

    def step_count():
        return actual_optimizer.t
    if double_buffering:
        averaging = DoubleBuffered(communicator, zero_fill)
    elif shard_state:
        averaging = Sharded(communicator, actual_optimizer, zero_fill)
    elif overlap:
        averaging = Overlapped(communicator, zero_fill, step_count,
                               accumulate, bucket_mb)
    else:
        averaging = AfterBackward(communicator, zero_fill, step_count,
                                  accumulate)
    if nan_check and not double_buffering:
        averaging = CheckFinite(averaging, communicator, step_count,
                                skips=lambda: getattr(
                                    actual_optimizer, 'dynamic_loss_scaling',
                                    False))
    if accumulate > 1:
        averaging = Accumulate(averaging)
    return MultiNodeOptimizer(actual_optimizer, communicator, averaging)
