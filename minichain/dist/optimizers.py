"""create_multi_node_optimizer: make any optimizer data-parallel; join:
finish shards of different lengths."""
import copy
import math

import numpy

from minichain import backend
from minichain.dist.trace import timeline
from minichain.dist.guards.agreement import format_ranks

# The wrapper's own attributes. Setting any other name on the wrapper sets
# it on the wrapped optimizer, so the wrappers keep their state in __dict__.
_OWN = ('actual_optimizer', 'communicator', 'zero_fill', 'needs_broadcast',
        'nan_check', '_active', 'accumulate', 'reducer', '_micro',
        '_overlap')
_MAX_NAMES = 3


class NonFiniteGradientError(FloatingPointError):
    """The averaged gradient holds inf or NaN: the update was skipped on
    every rank, and this error raised on every rank.

    Attributes:
        update: the number of the skipped update (``optimizer.t + 1``).
        ranks: the ranks whose own gradient was not finite (empty when
            only the sum overflowed).
        params: ``{rank: [parameter paths]}`` of those gradients.
    """

    def __init__(self, update, params):
        self.update = update
        self.params = {r: names for r, names in enumerate(params) if names}
        self.ranks = sorted(self.params)
        if self.ranks:
            where = '; '.join('{}: {}{}'.format(
                format_ranks([r]), ', '.join(names[:_MAX_NAMES]),
                ' and {} more'.format(len(names) - _MAX_NAMES)
                if len(names) > _MAX_NAMES else '')
                for r, names in self.params.items())
            cause = 'the local gradient was not finite on {} ({})'.format(
                format_ranks(self.ranks), where)
        else:
            cause = ('every local gradient was finite: their sum overflowed '
                     '(lower the learning rate or scale the loss)')
        super().__init__(
            'multi-node optimizer: update {}: the averaged gradient holds inf '
            'or NaN, so the update was skipped on every rank; {}'.format(
                update, cause))


def all_finite(arrays):
    """Whether every element of ``arrays`` (one device) is finite.

    A sum is finite iff every term is (short of an overflow, confirmed
    elementwise), so the good path costs one reduction per array and, on
    the GPU, one read of one value."""
    if not arrays:
        return True
    xp = backend.get_array_module(arrays[0])

    def total(a):
        return a.sum(dtype=numpy.float32 if a.dtype.itemsize < 4 else None)
    if xp is numpy:
        fast = math.isfinite(sum(float(total(a)) for a in arrays))
    else:
        fast = bool(xp.isfinite(xp.stack([total(a) for a in arrays]).sum()))
    return fast or all(bool(xp.isfinite(a).all()) for a in arrays)


class _MultiNodeOptimizer:
    """Wraps an optimizer: average gradients over ranks, then step.

    Everything not defined here (``lr``, ``t``, ``target``, ``add_hook``,
    ``serialize``...) reads and writes the wrapped optimizer.
    """

    def __init__(self, actual_optimizer, communicator, zero_fill=True,
                 nan_check=True, overlap=None, accumulate=1):
        d = self.__dict__
        d['actual_optimizer'] = actual_optimizer
        d['communicator'] = communicator
        d['zero_fill'] = zero_fill
        d['needs_broadcast'] = True
        d['nan_check'] = nan_check
        d['_active'] = None  # inside join: whether this rank has data
        d['accumulate'] = accumulate
        d['_micro'] = 0      # backward passes of this update so far
        d['_overlap'] = overlap  # the Reducer's keywords, or None
        d['reducer'] = None  # the overlap's Reducer, once set up

    def setup(self, link):
        """Set up the wrapped optimizer on ``link`` (with overlap, hook its
        parameters); the next update broadcasts rank 0's parameters.
        Returns self."""
        self.actual_optimizer.setup(link)
        self.needs_broadcast = True
        self._micro = 0
        if self._overlap is not None:
            from minichain.dist.averaging.overlap import Reducer
            if self.reducer is not None:
                self.reducer.close()
            self.reducer = Reducer(self.communicator, link,
                                   lambda: self.actual_optimizer.t,
                                   accumulate=self.accumulate,
                                   **self._overlap)
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

    def _target(self, where):
        """The wrapped optimizer's link; RuntimeError before ``setup``
        (the same on every rank: nothing was communicated yet)."""
        target = self.actual_optimizer.target
        if target is None:
            raise RuntimeError(
                'multi-node optimizer ({}).{}: call setup(link) first'
                .format(type(self.actual_optimizer).__name__, where))
        return target

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
        if self.needs_broadcast:
            if self.reducer is not None and self.reducer.step is not None:
                self.reducer.finish()  # buckets sent during that backward
            self.communicator.bcast_data(target)
            self.needs_broadcast = False
            return
        self._micro += 1
        if self._micro == self.accumulate:
            self._micro = 0
            self._average_and_step(target, args, kwds)
        self._arm()

    def _arm(self):
        """Let the hooks send buckets in the next backward if it is the
        last pass of a step (and not inside join, which averages after
        backward)."""
        if self.reducer is not None:
            self.reducer.armed = (self._active is None and
                                  self._micro == self.accumulate - 1)

    def _average_and_step(self, target, args=(), kwds=None):
        """Average the gradients and step; False once no rank has data
        (inside join)."""
        # This rank's own gradients: the averaging replaces them, and they
        # name the culprits should the mean not be finite.
        local = ([(n, p.grad) for n, p in target.namedparams()]
                 if self.nan_check else None)
        comm = self.communicator
        n_active = None
        if self._active is not None:  # join: the ranks count who has data
            n_active = comm._multi_node_mean_grad(
                target, self.zero_fill, self.actual_optimizer.t, self._active)
        elif self.reducer is not None:  # overlap: most of it is sent already
            self.reducer.finish(self.zero_fill)
        else:  # the public call, which users may wrap
            comm.multi_node_mean_grad(target, self.zero_fill)
        if n_active == 0:
            return False
        # The mean over the ranks with data, and over the backward passes
        # (the Reducer divides by both as it packs).
        factor = (1 if n_active is None else comm.size / n_active) / (
            1 if self.reducer is not None and n_active is None
            else self.accumulate)
        if factor != 1:
            for p in target.params():
                if p.grad is not None:
                    p.grad = p.grad * factor
        if self.nan_check:
            self._check_finite(target, local)
        self._step(target, args, kwds or {})
        return True

    def _check_finite(self, target, local):
        grads = [p.grad for p in target.params() if p.grad is not None]
        if all_finite(grads):
            return
        mine = [n for n, g in local if g is not None and not all_finite([g])]
        raise NonFiniteGradientError(self.actual_optimizer.t + 1,
                                     self.communicator.allgather_obj(mine))

    def _forward_backward(self, target, lossfun, args, kwds):
        if self._micro == 0:
            target.cleargrads()
        on_gpu = target.device_id >= 0
        with timeline.span('forward', sync=on_gpu):
            loss = lossfun(*args, **kwds)
        with timeline.span('backward', sync=on_gpu):
            loss.backward()

    def _step(self, target, args, kwds):
        with timeline.span('update', sync=target.device_id >= 0):
            self.actual_optimizer.update(None, *args, **kwds)

    def __getattr__(self, name):
        actual = self.__dict__.get('actual_optimizer')
        if actual is None or name.startswith('__'):  # e.g. while unpickling
            raise AttributeError(name)
        return getattr(actual, name)

    def __setattr__(self, name, value):
        if name in _OWN:
            self.__dict__[name] = value
        else:
            setattr(self.actual_optimizer, name, value)

    def __repr__(self):
        return 'MultiNode({!r}, {!r})'.format(self.actual_optimizer,
                                              self.communicator)


class _DoubleBufferingOptimizer(_MultiNodeOptimizer):
    """Overlaps each step's NCCL allreduce with the next iteration.

    The allreduce of step k runs on a side CUDA stream while step k+1
    computes; step k+1 then applies the averaged gradients of step k (one
    step stale). Two packed buffers alternate so that the one being applied
    is never the one being reduced; the default stream waits for the side
    stream on the GPU, never on the host.
    """

    def __init__(self, actual_optimizer, communicator, zero_fill=True,
                 nan_check=True):
        from minichain.dist.pure_nccl import PureNcclCommunicator
        if not isinstance(communicator, PureNcclCommunicator):
            raise ValueError('create_multi_node_optimizer: double_buffering '
                             'needs a pure_nccl (or hierarchical) '
                             'communicator, got {}'.format(
                                 type(communicator).__name__))
        backend.check_cuda_available()
        super().__init__(actual_optimizer, communicator, zero_fill, nan_check)
        d = self.__dict__
        d['_shadow'] = None        # holds the gradients being reduced
        d['_stream'] = None
        d['_done'] = None          # event: the side stream finished
        d['_in_flight'] = None     # gradients the side stream still reads
        d['_parity'] = 0
        d['_ready'] = False        # the shadow holds averaged gradients

    def update(self, lossfun=None, *args, **kwds):
        """A step applying the previous step's averaged gradients (see the
        class docstring); the first call after ``setup`` broadcasts."""
        target = self._target('update')
        if lossfun is not None:
            self._forward_backward(target, lossfun, args, kwds)
        d = self.__dict__
        if self.needs_broadcast:
            self.communicator.bcast_data(target)
            self.needs_broadcast = False
            self._new_shadow(target)
            return
        if d['_shadow'] is None:  # after broadcast_params() or a resume
            self._new_shadow(target)
        cupy = backend.get_cupy()
        if d['_stream'] is None:
            d['_stream'] = cupy.cuda.Stream(non_blocking=True)
        current = cupy.cuda.get_current_stream()
        if d['_done'] is not None:
            current.wait_event(d['_done'])
        d['_in_flight'] = None  # later default-stream work is ordered after
        ready = d['_ready']
        for (_, p), (_, s) in zip(target.namedparams(),
                                  d['_shadow'].namedparams()):
            p.grad_var, s.grad_var = s.grad_var, p.grad_var
        start = current.record()
        d['_stream'].wait_event(start)
        d['_in_flight'] = [s.grad for s in d['_shadow'].params()]
        self.communicator.multi_node_mean_grad_async(
            d['_shadow'], self.zero_fill, d['_stream'],
            'double{}'.format(d['_parity']))
        d['_done'] = d['_stream'].record()
        d['_parity'] ^= 1
        d['_ready'] = True
        if ready:
            self._step(target, args, kwds)

    def _new_shadow(self, target):
        shadow = copy.deepcopy(target)
        for p in shadow.params():  # holds gradients only
            p.cleargrad()
            p.update_rule = None
        self.__dict__['_shadow'], self.__dict__['_ready'] = shadow, False


def create_multi_node_optimizer(actual_optimizer, communicator,
                                double_buffering=False, zero_fill=True,
                                nan_check=True, overlap=None, bucket_mb=None,
                                accumulate=1):
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
      ranks whose own gradient was not finite. No message is added: a
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
    if double_buffering:
        if overlap or accumulate > 1:
            raise ValueError('create_multi_node_optimizer: double_buffering '
                             'cannot be combined with overlap or accumulate')
        return _DoubleBufferingOptimizer(actual_optimizer, communicator,
                                         zero_fill, nan_check)
    if overlap and not getattr(communicator, 'can_overlap', False):
        raise ValueError('create_multi_node_optimizer: the {} communicator '
                         'cannot overlap (use flat, pure_nccl or '
                         'hierarchical)'.format(communicator.name))
    return _MultiNodeOptimizer(
        actual_optimizer, communicator, zero_fill, nan_check,
        {'bucket_mb': bucket_mb} if overlap else None, accumulate)
