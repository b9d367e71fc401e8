"""AfterBackward: the plain averaging. Backward computes every gradient,
then the communicator averages them all at once (pack, allreduce, unpack:
``comm.multi_node_mean_grad``)."""
from minichain.dist.averaging.base import Averaging


class AfterBackward(Averaging):
    """Averages after backward through ``comm.multi_node_mean_grad``.

    Args:
        comm: a minichain.dist communicator.
        zero_fill: a gradient that is None on some ranks only counts as
            zeros there (else that case raises on every rank).
        step_count: returns the optimizer's update count (compared between
            ranks inside ``join``).
        passes: backward passes summed into each averaging (the mean
            divides by them too).
    """

    def __init__(self, comm, zero_fill=True, step_count=None, passes=1):
        self.comm, self.zero_fill = comm, zero_fill
        self.step_count = step_count or (lambda: None)
        self.passes = passes

    def average(self, model, has_data=None):
        if has_data is None:  # the public call, which users may wrap
            self.comm.multi_node_mean_grad(model, self.zero_fill)
            self.rescale(model, 1 / self.passes)
            return True
        # join: the header also counts the ranks with data
        n = self.comm.average_grads(
            model, self.zero_fill, self.step_count(), has_data)
        if n:  # the communicator divided by its size, not by n
            self.rescale(model, self.comm.size / n / self.passes)
        return n

    def rescale(self, model, factor):
        """Multiply every gradient by ``factor`` (unless it is 1)."""
        if factor != 1:
            for p in model.params():
                if p.grad is not None:
                    p.grad = p.grad * factor
