"""The buckets of an overlapped averaging (:mod:`minichain.dist.averaging.overlap`)
over MPI: the flat communicator's transport (and any communicator's on the
host).

A bucket is packed (scaled) into a host buffer and posted as a non-blocking
``Iallreduce`` on the communicator's bucket Wire. MPICH moves such a
collective on only while some MPI call runs on this rank, so the Reducer
tests the buckets in flight from every hook (the moment a gradient is
final, which on ResNet-50 is every few milliseconds of backward); after
backward it waits for them. CuPy gradients are packed on the device and
staged through host memory, as the flat communicator does.
"""
import numpy

from minichain import backend
from minichain.dist import hooks, mpi, packing


class MpiBuckets:
    """Buckets over MPI: pack into a host buffer, post a non-blocking
    Allreduce on the communicator's bucket Wire, test it from the hooks,
    wait for it after backward. CuPy gradients are packed on the device and
    staged through host memory (as the flat communicator does)."""

    def __init__(self, wire, device, grad_dtype=None):
        self.wire, self.device, self.grad_dtype = wire, device, grad_dtype

    def dtypes(self, entries):
        """``(buffer dtype, bytes per element on the wire)``."""
        dtype = packing.grad_dtype([(n, p, None) for n, p in entries],
                                    self.grad_dtype)
        return dtype, dtype.itemsize

    def empty(self, n, dtype):
        if self.device < 0:
            return numpy.empty(n, dtype)
        with backend.cuda_device(self.device):
            return backend.get_cupy().empty(n, dtype)

    def start(self, bucket, scale):
        host = self.pack(bucket, scale)
        bucket.work = (host, mpi.iallreduce_buffer(self.wire, host))

    def pack(self, bucket, scale):
        """Pack the bucket's gradients times ``scale``; returns the host
        buffer that carries them (a copy of the device's for CuPy)."""
        host = bucket.buf
        with hooks.span('pack', bucket.nbytes, sync=self.device >= 0):
            if self.device < 0:
                bucket.packer.pack(host, scale)
            else:
                if bucket.host is None:
                    bucket.host = numpy.empty(bucket.size, bucket.buf.dtype)
                host = bucket.host
                with backend.cuda_device(self.device):
                    bucket.packer.pack(bucket.buf, scale)
                    bucket.buf.get(out=host)
        return host

    def test(self, bucket):
        return self.wire.test(bucket.work[1])

    def complete(self, bucket):
        host, requests = bucket.work
        for request in requests:
            self.wire.wait(request)
        self.unstage(bucket, host)
        bucket.work = None

    def unstage(self, bucket, host):
        """CuPy: copy the summed host buffer back to the device."""
        if self.device >= 0:
            with backend.cuda_device(self.device):
                bucket.buf.set(host)

    def check(self, buckets):
        """Nothing to check after the buckets: over MPI the transfer is in
        float32 or float64 (the flat communicator's ``allreduce_grad_dtype``),
        which does not overflow where the gradients did not."""
