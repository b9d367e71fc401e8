"""CheckFinite: no step on a gradient holding inf or NaN (``nan_check``).

No message is added to the averaging: a non-finite value on any rank is
non-finite in the sum on every rank, so each rank checks its own averaged
gradient, and only on that error path do the ranks compare (who had the
non-finite value). A sharded state (``shard_state``) is the exception: each
rank holds the sum of its shard only, so the ranks agree on the verdict
(``Averaging.agree_finite``, one small allreduce).
"""

import numpy

from minichain import backend, kernel_seam
from minichain.backend import all_finite, finite_flag
from minichain.dist.averaging.base import Wrapper
from minichain.dist.failures import format_ranks

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


class CheckFinite(Wrapper):
    """Raises :class:`NonFiniteGradientError` on every rank when the
    averaged gradient is not finite, and no step is taken; unless the
    optimizer skips such a step itself (dynamic loss scaling: every rank
    sees the same inf or NaN in the average, skips and halves its scale).

    On the host the check runs before the step. On the GPU (``defer``) a
    host read right after the allreduce would wait for the whole queue
    every step, and outside the watchdog: the flag is computed on the
    device and read back once, after the step it guards was launched,
    inside ``comm.wait_until`` (a rank that never joined the allreduce is
    reported, not waited for). The step is then undone if the flag says
    so: the parameters and the update rules' state are saved on the
    device before it (:class:`_Undo`; the memory of one more copy of
    both, which ``nan_check=False`` spares).

    Args:
        inner: the averaging checked.
        comm: its communicator (gathers the culprits on the error path).
        step_count: returns the optimizer's update count.
        defer: read the flag after the step: None (default) for CuPy
            gradients of an averaging that holds the whole mean on each
            rank (a sharded one agrees on the verdict before the step).
        skips: returns whether the optimizer skips a non-finite step.
    """

    def __init__(self, inner, comm, step_count, defer=None,
                 skips=lambda: False):
        super().__init__(inner)
        self.comm, self.step_count, self.defer = comm, step_count, defer
        self.skips = skips
        self._pending = None  # (local gradients, device flag, its event)

    def average(self, model, has_data=None):
        # This rank's own gradients: the averaging replaces them, and they
        # name the culprits should the mean not be finite.
        local = [(n, p.grad) for n, p in model.namedparams()]
        self._pending = None
        n = self.inner.average(model, has_data)
        grads = self.inner.averaged_grads(model) if n else None
        if grads:
            xp = backend.get_array_module(grads[0])
            if self.skips():
                # The optimizer reads the gradients on the host (loss
                # scaling's check): the averaging is waited for here, where
                # the watchdog sees a rank that never joined it.
                self._wait(_event(xp))
            elif self.defer or (self.defer is None and xp is not numpy
                                and self.inner.whole_mean):
                self._pending = local, finite_flag(grads), _event(xp)
            elif not self.inner.agree_finite(self._read(
                    finite_flag(grads), _event(xp), grads)):
                self._raise(local)
        return n

    def step(self, optimizer, *args, **kwds):
        pending, self._pending = self._pending, None
        if pending is None:
            return self.inner.step(optimizer, *args, **kwds)
        local, flag, event = pending
        undo = _Undo(optimizer)
        self.inner.step(optimizer, *args, **kwds)
        if not self._read(flag, event, self.inner.averaged_grads(
                optimizer.target)):
            undo()
            self._raise(local)

    def _read(self, flag, event, grads):
        """The flag, read on the host once ``event`` has passed; a False
        confirmed elementwise (an overflow of a sum is no inf)."""
        self._wait(event)
        return bool(flag) or all_finite(grads)

    def _wait(self, event):
        """Until ``event`` has passed, watched as an MPI wait is."""
        self.comm.wait_until(lambda: event.done,
                             'the NaN check of the averaged gradients',
                             on_stall=getattr(self.comm, 'abort_nccl', None))

    def _raise(self, local):
        mine = [n for n, g in local if g is not None and not all_finite([g])]
        raise NonFiniteGradientError(self.step_count() + 1,
                                     self.comm.allgather_obj(mine))


_HOST = type('Done', (), {'done': True})()  # NumPy's work: done


def _event(xp):
    """An event after the work queued so far on the current stream."""
    return _HOST if xp is numpy else xp.cuda.get_current_stream().record()


class _Undo:
    """What an optimizer's step changes, saved before it: the parameters,
    the update rules' state arrays and step counts. Calling it puts them
    back. On the device: one copy per dtype (``concatenate``), no host
    wait."""

    def __init__(self, optimizer):
        self.optimizer, self.t = optimizer, optimizer.t
        self.rules, self.places = [], []
        for param in optimizer.target.params(include_uninit=False):
            rule = getattr(param, 'update_rule', None)
            self.rules.append((param, rule, rule and rule.t,
                               rule and rule.state is None))
            self.places.append(lambda p=param: p.array)
            for name in sorted((rule and rule.state) or ()):
                self.places.append(lambda r=rule, k=name: r.state[k])
        self.saved = {}
        for i, a in enumerate(place() for place in self.places):
            self.saved.setdefault(a.dtype, []).append((i, a))
        for dtype, group in self.saved.items():
            xp = backend.get_array_module(group[0][1])
            self.saved[dtype] = ([i for i, _ in group], xp.concatenate(
                [a.ravel() for _, a in group]))

    def __call__(self):
        for indexes, flat in self.saved.values():
            at = 0
            for i in indexes:
                a = self.places[i]()
                a[...] = flat[at:at + a.size].reshape(a.shape)
                at += a.size
        for param, rule, t, stateless in self.rules:
            param.update_rule = rule
            if rule is not None:
                rule.t = t
                if stateless:
                    rule.state = None
        self.optimizer.t = self.t
        kernel_seam.parameters_changed()
