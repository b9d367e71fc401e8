"""The flat communicator: one packed buffer, one allreduce (MPI's; on one
machine the shared-memory layer sums it instead, transports/)."""
import numpy

from minichain import backend
from minichain.dist import mpi, packing
from minichain.dist.communicator_base import CommunicatorBase


class FlatCommunicator(CommunicatorBase):
    """Averages gradients with one packed MPI Allreduce per step.

    All gradients are packed, in ``namedparams()`` order, into one
    contiguous buffer reused across steps, each scaled by ``1/size`` on the
    way in (the one division: the sum of scaled values is the mean); the
    buffer is summed over the ranks in place, and each gradient becomes a
    view of its segment. The buffer dtype is the widest gradient dtype, or
    ``allreduce_grad_dtype`` (float32 or float64).
    """

    name = 'flat'

    def mean_grads(self, model, entries):
        """Pack (scaled by 1/size), sum over the ranks, unpack."""
        packer = self.Packer(entries)
        buf = self.packed_buffer(
            model, entries[0][1].array,
            packing.grad_dtype(entries, self.allreduce_grad_dtype),
            packer.total)
        for lo, hi in self.pieces(buf):  # one piece; see Pipelined
            packer.pack(buf, 1.0 / self.size, lo, hi)
            self.allreduce_packed(buf[lo:hi])
        packer.unpack(buf)

    def packed_buffer(self, model, like, dtype, n):
        """``model``'s packed buffer: ``n`` elements of ``dtype`` on the
        device of the array ``like``, reused at every step (stale contents).
        On one machine the shared-memory layer puts it where every rank can
        read it (:mod:`~minichain.dist.transports.shared_memory`)."""
        return self.buffers.get(model, 'packed', like, dtype, n)

    def allreduce_packed(self, buf):
        """Sum ``buf`` over the ranks, in place."""
        if backend.get_array_module(buf) is numpy:
            return self.sum_on_host(buf)
        # CuPy: through a host copy (MPI reads host memory)
        host = self.buffers.get(self, 'host', None, buf.dtype, buf.size)
        with backend.cuda_device(backend.get_device_id(buf)):
            buf.get(out=host)
            self.sum_on_host(host)
            buf.set(host)

    def sum_on_host(self, buf):
        """Sum the host array ``buf`` over the ranks, in place: MPI's own
        Allreduce (the ring communicator sums around its ring instead)."""
        MPI = mpi.import_mpi()
        self.wire.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def pieces(self, buf):
        """The ``(lo, hi)`` element ranges ``buf`` is packed and summed in:
        the whole buffer, in messages below MPI's 2 GiB count limit. The
        pipeline layer (:class:`~minichain.dist.transports.pipeline.
        Pipelined`) cuts host buffers in pieces of a few MB instead."""
        return mpi.chunks(buf.size, buf.itemsize)
