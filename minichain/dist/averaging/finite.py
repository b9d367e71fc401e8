"""CheckFinite: no step on a gradient holding inf or NaN (``nan_check``).

No message is added to the averaging: a non-finite value on any rank is
non-finite in the sum on every rank, so each rank checks its own averaged
gradient, and only on that error path do the ranks compare (who had the
non-finite value). A sharded state (``shard_state``) is the exception: each
rank holds the sum of its shard only, so the ranks agree on the verdict
(``Averaging.agree_finite``, one small allreduce).
"""
import math

import numpy

from minichain import backend
from minichain.dist.averaging.base import Wrapper
from minichain.dist.guards.agreement import format_ranks

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


class CheckFinite(Wrapper):
    """Raises :class:`NonFiniteGradientError` on every rank, before the
    step, when the averaged gradient is not finite, unless the optimizer
    skips such a step itself (dynamic loss scaling: every rank sees the
    same inf or NaN in the average, skips and halves its scale).

    Args:
        inner: the averaging checked.
        comm: its communicator (gathers the culprits on the error path).
        step_count: returns the optimizer's update count.
        skips: returns whether the optimizer skips a non-finite step.
    """

    def __init__(self, inner, comm, step_count, skips=lambda: False):
        super().__init__(inner)
        self.comm, self.step_count, self.skips = comm, step_count, skips

    def average(self, model, has_data=None):
        # This rank's own gradients: the averaging replaces them, and they
        # name the culprits should the mean not be finite.
        local = [(n, p.grad) for n, p in model.namedparams()]
        n = self.inner.average(model, has_data)
        if n:
            self._check(model, local)
        return n

    def _check(self, model, local):
        if self.skips() or self.inner.agree_finite(all_finite(
                self.inner.averaged_grads(model))):
            return
        mine = [n for n, g in local if g is not None and not all_finite([g])]
        raise NonFiniteGradientError(self.step_count() + 1,
                                     self.comm.allgather_obj(mine))
