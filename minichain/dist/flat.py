"""The flat communicator: one packed buffer, one MPI Allreduce."""
import numpy

from minichain import backend
from minichain.dist.transports import mpi, packing
from minichain.dist.trace import timeline
from minichain.dist.communicator_base import CommunicatorBase


# A chunk of a few MB is reduced while it is still in the last-level cache
# from its packing, which is faster than one Allreduce of the whole buffer
# (bench/allreduce.py compares the two).
PIPELINE_BYTES = 4 << 20


class FlatCommunicator(CommunicatorBase):
    """Averages gradients with one packed MPI Allreduce per step.

    All gradients are packed, in ``namedparams()`` order, into one
    contiguous buffer reused across steps, each scaled by ``1/size`` on the
    way in (the one division: the sum of scaled values is the mean). The
    in-place Allreduce of the buffer is issued in pipeline chunks of
    ``PIPELINE_BYTES``, each reduced while still in cache from its packing.
    Each gradient then becomes a view of its segment. CuPy gradients are
    packed on the device and staged through host memory. The buffer dtype
    is the widest gradient dtype, or ``allreduce_grad_dtype`` (float32 or
    float64).
    """

    name = 'flat'

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        self._buffers = packing.BufferCache()

    def _mean_grads(self, model, entries):
        dtype = packing.grad_dtype(entries, self.allreduce_grad_dtype)
        packer = packing.Packer(entries)
        host = self._buffers.get(model, 'host', numpy, dtype, packer.total)
        if backend.get_array_module(entries[0][1].array) is numpy:
            self._mean_on_host(packer, host)
        else:
            self._mean_through_host(model, packer, host)

    def _mean_on_host(self, packer, host):
        """NumPy gradients: pack, Allreduce and unpack ``host`` chunk by
        chunk, each chunk reduced right after it is packed."""
        scale = 1.0 / self.size
        step = max(1, min(PIPELINE_BYTES, mpi.CHUNK_BYTES) // host.itemsize)
        for lo in range(0, packer.total, step):
            hi = min(packer.total, lo + step)
            nbytes = (hi - lo) * host.itemsize
            with timeline.span('pack', nbytes):
                packer.pack(host, scale, lo, hi)
            with timeline.span('allreduce', nbytes):
                self._sum_across_ranks(host[lo:hi])
        with timeline.span('unpack', host.nbytes):
            packer.unpack(host)

    def _mean_through_host(self, model, packer, host):
        """CuPy gradients: pack on the device, Allreduce a host copy of the
        buffer, copy it back and unpack on the device."""
        first = packer.entries[0][1].array
        with backend.cuda_device(backend.get_device_id(first)):
            dev = self._buffers.get(model, 'device',
                                    backend.get_array_module(first),
                                    host.dtype, packer.total)
            with timeline.span('pack', host.nbytes, sync=True):
                packer.pack(dev, 1.0 / self.size)
                dev.get(out=host)
            with timeline.span('allreduce', host.nbytes):
                self._sum_across_ranks(host)
            with timeline.span('unpack', host.nbytes, sync=True):
                dev.set(host)
                packer.unpack(dev)

    def _sum_across_ranks(self, buf):
        """Replace the 1-d host array ``buf`` by its sum over all ranks, in
        place: MPI's own Allreduce here (the ring communicator overrides
        this method only)."""
        mpi.allreduce_buffer(self._wire, buf, mpi.import_mpi().SUM)
