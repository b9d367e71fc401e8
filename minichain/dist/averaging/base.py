"""Averaging: how the multi-node optimizer makes each gradient its mean
over ranks.

The optimizer (:mod:`minichain.dist.optimizers`) only says *when*: after
each ``update``'s backward pass it calls :meth:`Averaging.average` and steps
if that returns a count of ranks. *How* is one of three implementations:

* :class:`~minichain.dist.averaging.after_backward.AfterBackward` -- the
  plain one: after backward, the communicator's ``multi_node_mean_grad``
  (pack, allreduce, unpack);
* :class:`~minichain.dist.averaging.overlap.Overlapped` -- buckets
  allreduced while backward still runs;
* :class:`~minichain.dist.averaging.double_buffered.DoubleBuffered` -- the
  gradients of step t averaged on a side stream during step t + 1.

Features that change *which* passes are averaged, or check the result, are
wrappers around any of them, using only the methods below:
:class:`~minichain.dist.averaging.accumulate.Accumulate` (k backward passes
per step), :class:`~minichain.dist.averaging.finite.CheckFinite` (the NaN
check) and :func:`~minichain.dist.averaging.join.join` (shards of different
lengths).

The calls the optimizer makes, on every rank in the same order::

    setup(model)                   # at optimizer.setup(model)
    prepare()                      # before each backward pass (then again
    average(model) -> step?        #   after each update): the pass's
    stepped(model) if step         #   gradients averaged; the step
    discard()                      # instead of average: the first update
                                   #   after setup broadcasts, no step
"""


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
    """

    passes = 1
    starts_step = True
    can_join = True
    reducer = None

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

    def stepped(self, model):
        """Called after the optimizer stepped on the averaged gradients
        (where a sharded optimizer state would gather the parameters)."""

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

    def setup(self, model):
        self.inner.setup(model)

    def prepare(self, final=True):
        self.inner.prepare(final)

    def average(self, model, has_data=None):
        return self.inner.average(model, has_data)

    def stepped(self, model):
        self.inner.stepped(model)

    def discard(self):
        self.inner.discard()
