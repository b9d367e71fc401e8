"""The flat communicator: one packed buffer, one MPI Allreduce."""
import numpy

from minichain import backend
from minichain.dist import _mpi, _packing, timeline
from minichain.dist.communicator_base import CommunicatorBase


# Chunks of a few MB fit in the last-level cache; MPI reduces them faster
# than one message of hundreds of MB (measured: bench/allreduce.py).
PIPELINE_BYTES = 4 << 20


class FlatCommunicator(CommunicatorBase):
    """Averages gradients with one packed MPI Allreduce per step.

    All gradients are packed, in ``namedparams()`` order, into one
    contiguous buffer reused across steps, each scaled by ``1/size`` on the
    way in (the one division: the sum of scaled values is the mean). The
    in-place Allreduce of the buffer is issued in pipeline chunks of
    ``PIPELINE_BYTES``, each reduced while still in cache from its packing
    (on 2 ranks, 100 MB takes 0.6-0.8x the time of one raw Allreduce of
    the whole buffer). Each gradient then becomes a view of its segment.
    CuPy gradients are packed on the device and staged through host memory.
    The buffer dtype is the widest gradient dtype, or
    ``allreduce_grad_dtype`` (float32 or float64).
    """

    name = 'flat'

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        self._buffers = _packing.BufferCache()

    def _mean_grads(self, model, entries):
        MPI = _mpi.import_mpi()
        dtype = _packing.grad_dtype(entries, self.allreduce_grad_dtype)
        packer = _packing.Packer(entries)
        n = packer.total
        xp = backend.get_array_module(entries[0][1].array)
        scale = 1.0 / self.size
        host = self._buffers.get(model, 'host', numpy, dtype, n)
        rec = timeline.active
        if xp is numpy:
            step = max(1, min(PIPELINE_BYTES, _mpi.CHUNK_BYTES)
                       // dtype.itemsize)
            if rec:
                t = rec.start()
            for lo in range(0, n, step):
                hi = min(n, lo + step)
                packer.pack(host, scale, lo, hi)
                if rec:
                    t = rec.stop('pack', t, (hi - lo) * dtype.itemsize)
                self._wire.Allreduce(MPI.IN_PLACE, host[lo:hi], op=MPI.SUM)
                if rec:
                    t = rec.stop('allreduce', t, (hi - lo) * dtype.itemsize)
            packer.unpack(host)
            if rec:
                rec.stop('unpack', t, host.nbytes)
            return
        with backend.cuda_device(backend.get_device_id(entries[0][1].array)):
            dev = self._buffers.get(model, 'device', xp, dtype, n)
            if rec:  # on the GPU, 'pack' includes the copy to the host
                t = rec.start(sync=True)
            packer.pack(dev, scale)
            dev.get(out=host)
            if rec:
                t = rec.stop('pack', t, host.nbytes, sync=True)
            _mpi.allreduce_buffer(self._wire, host, MPI.SUM)
            if rec:
                t = rec.stop('allreduce', t, host.nbytes)
            dev.set(host)
            packer.unpack(dev)
            if rec:
                rec.stop('unpack', t, host.nbytes, sync=True)
