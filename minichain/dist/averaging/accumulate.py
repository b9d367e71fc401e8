"""Accumulate: several backward passes per step (``accumulate=k``: DDP's
``no_sync``, Horovod's ``backward_passes_per_step``)."""
from minichain.dist.averaging.base import Wrapper


class Accumulate(Wrapper):
    """Averages only every ``inner.passes``-th call; the calls between only
    let the gradients add up, without communicating.

    The inner averaging divides by its ``passes`` as well as by the ranks,
    so that with mean losses over equal micro-batches a step equals one on
    the ``passes`` times larger batch; an overlapped one sends buckets only
    during the last pass (the others' gradients are not final).
    """

    def __init__(self, inner):
        super().__init__(inner)
        self.done = 0  # backward passes of this step so far

    starts_step = property(lambda self: self.done == 0)

    def setup(self, model):
        self.done = 0
        self.inner.setup(model)

    def prepare(self, final=True):
        self.inner.prepare(final and self.done == self.passes - 1)

    def average(self, model, has_data=None):
        self.done += 1
        if self.done < self.passes:
            return 0
        self.done = 0
        return self.inner.average(model, has_data)
