"""The tracing layer: the timeline's spans around a communicator's steps.

:class:`Traced`, put in front of a communicator class by
:func:`minichain.dist.create_communicator`, starts the timeline that
``MINICHAIN_TIMELINE`` asks for (:mod:`minichain.dist.trace.timeline`),
writes it at ``finalize``, and times the protocol's steps: the header
before an averaging (``sync``), ``pack``, ``allreduce`` and ``unpack`` of
the packed buffer, and ``bcast_data``'s ``bcast``. While nothing records,
a span costs one call (``bench/timeline_cost.py``).
"""
from minichain import backend
from minichain.dist import packing
from minichain.dist.trace import timeline


class TracedPacker(packing.Packer):
    """A Packer whose ``pack`` and ``unpack`` are timeline spans."""

    def pack(self, buf, scale=None, lo=0, hi=None):
        hi = self.total if hi is None else hi
        with timeline.span('pack', (hi - lo) * buf.itemsize,
                           sync=backend.get_device_id(buf) >= 0):
            super().pack(buf, scale, lo, hi)

    def unpack(self, buf):
        with timeline.span('unpack', buf.nbytes,
                           sync=backend.get_device_id(buf) >= 0):
            super().unpack(buf)


class Traced:
    """Layer: the timeline around a communicator's protocol."""

    # The timed Packer only while recording: else the protocol's own, at no
    # cost (a gradient averaging of a few KB is mostly Python).
    Packer = property(lambda self: TracedPacker if timeline.active
                      else super(Traced, self).Packer)

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        timeline.start_from_env(self)

    # The two steps of every averaging test first whether anything records:
    # an empty span's call and ``with`` cost 3% of a 4 KB averaging.
    def plan_grads(self, model, zero_fill=False, step=None, active=None):
        if timeline.active is None:
            return super().plan_grads(model, zero_fill, step, active)
        # A rank that arrives early at the header waits there for the
        # slower one, so the timeline names that wait.
        with timeline.span('sync'):
            return super().plan_grads(model, zero_fill, step, active)

    def allreduce_packed(self, buf):
        if timeline.active is None:
            return super().allreduce_packed(buf)
        with timeline.span('allreduce', buf.nbytes):
            super().allreduce_packed(buf)

    def reduce_scatter(self, buf):
        with timeline.span('reduce-scatter', buf.nbytes):
            super().reduce_scatter(buf)

    def allgather_shards(self, buf):
        with timeline.span('allgather', buf.nbytes):
            super().allgather_shards(buf)

    def bcast_packed(self, buf):
        with timeline.span('bcast', buf.nbytes):
            super().bcast_packed(buf)

    def finalize(self):
        timeline.finish_owned(self)
        super().finalize()
