"""The buckets of an overlapped averaging (:mod:`minichain.dist.averaging.overlap`)
on GPUs, with NCCL: the pure_nccl and hierarchical communicators' transports.

Backward launches its kernels on the current (compute) stream. When a
bucket's last gradient is final, the host records an event on that stream,
and a side stream waits for it: the side stream then packs the bucket
(scaled), reduces it with NCCL and records a ``done`` event, while the
compute stream goes on with backward. After backward the compute stream
waits for every ``done`` event (on the GPU; the host never waits), so the
update reads averaged gradients. Every array the side stream reads (the
gradients, held by the bucket's packer, and the wire buffers) stays
referenced until then, so that CuPy's memory pool cannot hand its memory to
the compute stream while the side stream still reads it.
"""
import numpy

from minichain import backend
from minichain.dist import hooks, mpi
from minichain.dist.nccl import (BFLOAT16, from_bfloat16_bits,
                                            narrow, nccl_dtype, nccl_module,
                                            to_bfloat16_bits, widen)


class _Work:
    """A bucket's state on the GPU while it is in flight."""

    def __init__(self, wire):
        self.wire = wire        # what NCCL reduces (bfloat16: uint16 bits)
        self.reduced = None     # event: the side stream's NCCL call is done
        self.host = None        # hierarchical: the node's sum, on the host
        self.requests = ()      # hierarchical: the inter-node allreduce
        self.back = None        # hierarchical: event, the sum is on the GPU
        self.done = None        # event: the bucket is averaged


class NcclBuckets:
    """pure_nccl's buckets: one NCCL allreduce each, on a side stream."""

    def __init__(self, comm, device):
        self.comm, self.device = comm, device
        comm.init_nccl(device)
        cupy = backend.get_cupy()
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.wire_dtype = None

    def dtypes(self, entries):
        """``(buffer dtype, bytes per element on the wire)``; bfloat16 is
        packed in float32 and sent as uint16 bit patterns."""
        self.wire_dtype = self.comm.transfer_dtype([(n, p, None)
                                                 for n, p in entries])
        if self.wire_dtype == BFLOAT16:
            return numpy.dtype(numpy.float32), 2
        dtype = numpy.dtype(self.wire_dtype)
        return dtype, dtype.itemsize

    def empty(self, n, dtype):
        cupy = backend.get_cupy()
        with cupy.cuda.Device(self.device):
            return cupy.empty(n, dtype)

    def start(self, bucket, scale):
        """Enqueue the bucket on the side stream, after the kernels that
        computed its gradients."""
        self.comm.wait_in_flight()
        cupy = backend.get_cupy()
        nccl = nccl_module()
        with cupy.cuda.Device(self.device):
            self.stream.wait_event(cupy.cuda.get_current_stream().record())
            with self.stream:
                with hooks.span('pack', bucket.nbytes, sync=True):
                    bucket.packer.pack(bucket.buf, scale)
                work = bucket.work = _Work(
                    to_bfloat16_bits(bucket.buf)
                    if self.wire_dtype == BFLOAT16 else bucket.buf)
                self._reduce(nccl, work)
                work.reduced = self.stream.record()
                if not self._later_stages():
                    self._unwire(bucket)
                    # Recorded after the conversion back from bfloat16: an
                    # event covers only the work queued before it.
                    work.done = self.stream.record()

    def _reduce(self, nccl, work):
        self.comm.sum_on_device(nccl, work.wire,
                                nccl_dtype(nccl, self.wire_dtype), self.stream)

    def _later_stages(self):
        return False

    def _unwire(self, bucket):
        """On the side stream: the wire's bfloat16 bits back into float32."""
        if bucket.work.wire is not bucket.buf:
            bucket.buf[...] = from_bfloat16_bits(bucket.work.wire)

    def test(self, bucket):
        done = bucket.work.done
        return done is not None and done.done

    def complete(self, bucket):
        """Order the compute stream after the bucket (no host wait)."""
        cupy = backend.get_cupy()
        with cupy.cuda.Device(self.device):
            self._finish_stages(bucket)
            cupy.cuda.get_current_stream().wait_event(bucket.work.done)
            # the next averaging's host waits for it under the watchdog
            self.comm.in_flight = bucket.work.done
            bucket.work = None

    def check(self, buckets):
        """After every bucket completed: the inf/NaN check of a 16-bit
        transfer, as without overlap, in one host wait for the step (the
        averages are the same on every rank, so every rank raises)."""
        if self.wire_dtype != BFLOAT16 and numpy.dtype(
                self.wire_dtype).itemsize >= 4:
            return
        cupy = backend.get_cupy()
        with cupy.cuda.Device(self.device):
            finite = cupy.stack([cupy.isfinite(b.buf).all() for b in buckets])
            self.comm.wait_nccl(cupy.cuda.get_current_stream().record(),
                                 'the NCCL buckets',
                                 self.comm.bucket_wire())
            if not bool(finite.all()):
                raise FloatingPointError(
                    '{}: the averaged gradients hold inf or NaN after the {} '
                    'allreduce (an overflow of the transfer dtype, or '
                    'non-finite gradients on some rank)'.format(
                        self.comm.name, self.wire_dtype))

    def _finish_stages(self, bucket):
        return None


class HierarchicalBuckets(NcclBuckets):
    """hierarchical's buckets, in three stages as its allreduce.

    From the hooks, each bucket is reduced by NCCL onto the node's first
    rank. That rank, testing from the hooks, copies each reduced bucket to
    the host once its event is done, allreduces it between the nodes' first
    ranks (non-blocking MPI on a Wire of its own) and copies it back. After
    backward every rank broadcasts each bucket inside its node, in launch
    order: NCCL needs the same order of calls on every rank of a node
    (reduce of every bucket, then broadcast of every bucket).
    """

    def __init__(self, comm, device):
        super().__init__(comm, device)
        self.leader = comm.intra_rank == 0 and comm.inter_size > 1
        self.inter = comm.bucket_inter_wire()
        cupy = backend.get_cupy()
        with cupy.cuda.Device(device):
            self.copy = cupy.cuda.Stream(non_blocking=True)
        self.queue = []  # the leader's buckets between the stages, in order

    def _reduce(self, nccl, work):
        w = work.wire
        self.comm.nccl_comm.reduce(
            w.data.ptr, w.data.ptr, w.size, nccl_dtype(nccl, self.wire_dtype),
            nccl.NCCL_SUM, 0, self.stream.ptr)

    def _later_stages(self):
        return True

    def start(self, bucket, scale):
        super().start(bucket, scale)
        if self.leader:
            self.queue.append(bucket)

    def test(self, bucket):
        with backend.get_cupy().cuda.Device(self.device):
            self._advance(until=None)
        return super().test(bucket)

    def _advance(self, until):
        """Move the leader's buckets through the host stages, in order:
        without ``until`` only as far as nothing has to be waited for;
        else waiting, until ``until`` is through."""
        block = until is not None
        while self.queue:
            bucket = self.queue[0]
            work = bucket.work
            if work.host is None:
                if not work.reduced.done and not block:
                    return
                self.inter.wait_until(lambda: work.reduced.done,
                                      'the NCCL reduce',
                                      on_stall=self.comm.abort_nccl)
                self.copy.wait_event(work.reduced)
                work.host = widen(work.wire.get(stream=self.copy))
                work.requests = mpi.iallreduce_buffer(self.inter, work.host)
            if not self.inter.test(list(work.requests)):
                if not block:
                    return
                for request in work.requests:
                    self.inter.wait(request)
            work.host = narrow(work.host, work.wire.dtype)
            work.wire.set(work.host, stream=self.copy)
            work.back = self.copy.record()
            self.queue.pop(0)
            if bucket is until:
                return

    def _finish_stages(self, bucket):
        nccl = nccl_module()
        if self.leader and bucket in self.queue:
            self._advance(until=bucket)
        work = bucket.work
        with self.stream:
            if work.back is not None:
                self.stream.wait_event(work.back)
            w = work.wire
            self.comm.nccl_comm.bcast(w.data.ptr, w.size, nccl_dtype(
                nccl, self.wire_dtype), 0, self.stream.ptr)
            self._unwire(bucket)
            work.done = self.stream.record()
