"""Averaging: how the multi-node optimizer makes each gradient its mean
over ranks.

The optimizer (:mod:`minichain.dist.optimizers`) only says *when*: after
each ``update``'s backward pass it calls :meth:`Averaging.average` and steps
if that returns a count of ranks. *How* is one of the implementations
listed in :mod:`minichain.dist.averaging`; the features that change *which*
passes are averaged, or check the result, are wrappers around any of them
(listed there too), using only the methods below.

The calls the optimizer makes, on every rank in the same order::

    setup(model)                   # at optimizer.setup(model)
    prepare()                      # before each backward pass (then again
    average(model) -> step?        #   after each update): the pass's
    step(optimizer) if step        #   gradients averaged; the step, and
    stepped(model)                 #   what follows it
    discard()                      # instead of average: the first update
                                   #   after setup broadcasts, no step

:class:`~minichain.dist.averaging.sharded.Sharded` (``shard_state``) steps
only this rank's shard of the parameters (``step``), then gathers them
(``stepped``).
"""
import contextlib

from minichain.dist import hooks


class Averaging:
    """The interface (and the defaults: nothing to set up or prepare).

    Attributes:
        passes: backward passes whose summed gradients one ``average``
            takes: the mean divides by the ranks and by the passes (which
            :class:`~minichain.dist.averaging.accumulate.Accumulate` counts).
        starts_step: whether the next backward pass is the first of a step
            (the optimizer clears the gradients before it).
        can_join: whether :func:`~minichain.dist.averaging.join.join` can
            shadow this averaging.
        reducer: the overlap's Reducer, else None (for inspection).
        whole_mean: whether each rank holds the whole mean after
            ``average`` (not so a sharded state: each rank its shard).
    """

    passes = 1
    starts_step = True
    can_join = True
    reducer = None
    whole_mean = True

    def setup(self, model):
        """Average ``model``'s gradients from now on (called by the
        optimizer's ``setup``; an overlapped averaging hooks the model)."""

    def prepare(self, final=True):
        """Called before each backward pass. ``final``: the pass is the last
        before ``average``, so each of its gradients is final for this step
        as soon as backward makes it (an overlapped averaging sends it
        then); False: average only after backward."""

    def average(self, model, has_data=None):
        """Replace ``model``'s gradients by their mean over ranks (and over
        ``passes``). Collective.

        Args:
            has_data: None, or inside ``join`` whether this rank still
                has data (a rank without contributes zeros, and the mean is
                over the ranks with data).
        Returns:
            Whether the optimizer steps: True, or inside ``join`` the
            number of ranks the mean is over; False or 0 when nothing is
            to be stepped (more passes to accumulate, the first step of a
            double buffer, no rank with data left inside ``join``).
        """
        raise NotImplementedError(type(self).__name__ + '.average')

    def step(self, optimizer, *args, **kwds):
        """Step ``optimizer`` (the wrapped one) on the averaged gradients:
        every parameter here; a sharded state steps only its shard."""
        with hooks.span('update', sync=optimizer.target.device_id >= 0):
            optimizer.update(None, *args, **kwds)

    def stepped(self, model):
        """Called after the optimizer stepped on the averaged gradients
        (where a sharded optimizer state gathers the parameters)."""

    def averaged_grads(self, model):
        """The averaged gradients this rank holds (checked by the NaN
        check): all of them here."""
        return [p.grad for p in model.params() if p.grad is not None]

    def agree_finite(self, finite):
        """Whether the averaged gradients are finite on every rank, given
        ``finite`` for :meth:`averaged_grads` (each rank holds the whole
        mean here: no message)."""
        return finite

    def gathered_state(self, model):
        """A context in which the optimizer's state is whole on every rank
        (a sharded one gathers it; collective)."""
        return contextlib.nullcontext()

    def serialize(self, optimizer, serializer):
        """Save or load ``optimizer`` (the wrapped one)."""
        optimizer.serialize(serializer)

    def discard(self):
        """The gradients of the backward pass just run are not averaged
        (the first update after setup broadcasts instead): finish what was
        started on them. Collective."""


class Wrapper(Averaging):
    """An averaging that changes what another does: every call goes to
    ``inner`` unless the subclass says otherwise."""

    def __init__(self, inner):
        self.inner = inner

    passes = property(lambda self: self.inner.passes)
    starts_step = property(lambda self: self.inner.starts_step)
    can_join = property(lambda self: self.inner.can_join)
    reducer = property(lambda self: self.inner.reducer)
    whole_mean = property(lambda self: self.inner.whole_mean)

    def setup(self, model):
        self.inner.setup(model)

    def prepare(self, final=True):
        self.inner.prepare(final)

    def average(self, model, has_data=None):
        return self.inner.average(model, has_data)

    def step(self, optimizer, *args, **kwds):
        self.inner.step(optimizer, *args, **kwds)

    def stepped(self, model):
        self.inner.stepped(model)

    def averaged_grads(self, model):
        return self.inner.averaged_grads(model)

    def agree_finite(self, finite):
        return self.inner.agree_finite(finite)

    def gathered_state(self, model):
        return self.inner.gathered_state(model)

    def serialize(self, optimizer, serializer):
        self.inner.serialize(optimizer, serializer)

    def discard(self):
        self.inner.discard()
