"""The pure_nccl communicator: gradients averaged on the GPUs by NCCL.

CuPy and NCCL are reached only through ``minichain.backend`` and only when a
GPU gradient is first averaged, so importing this module needs neither.
"""
import atexit
import sys
import weakref

import numpy

from minichain import backend
from minichain.dist import hooks, packing
from minichain.dist.nccl import (  # noqa: F401 - also public here
    BFLOAT16, check_one_gpu_per_rank, from_bfloat16_bits, nccl_dtype,
    nccl_module, to_bfloat16_bits)
from minichain.dist.communicator_base import CommunicatorBase, with_layers
from minichain.dist.flat import FlatCommunicator


def init_nccl_comm(mpi_comm, device_id):
    """An NCCL communicator over the ranks of ``mpi_comm``, on GPU
    ``device_id``: rank 0 creates NCCL's unique ID, MPI broadcasts it, and
    every rank joins with it on its own GPU (collective)."""
    nccl = nccl_module()
    uid = nccl.get_unique_id() if mpi_comm.rank == 0 else None
    uid = mpi_comm.bcast(uid, root=0)
    with backend.cuda_device(device_id):
        return nccl.NcclCommunicator(mpi_comm.size, uid, mpi_comm.rank)


class PureNcclCommunicator(CommunicatorBase):
    """Averages CuPy gradients with one NCCL allreduce of a packed buffer.

    Every rank builds its NCCL communicator (:func:`init_nccl_comm`) lazily,
    at the first GPU allreduce, on the device holding the gradients (after
    the user selected it: device = ``comm.intra_rank`` by convention).
    Gradients are scaled by ``1/size`` while packed, so the sum is already
    the mean: in a float16 or bfloat16 transfer (``allreduce_grad_dtype``)
    no partial sum exceeds the mean's magnitude, and the result is checked
    for inf/NaN. NumPy gradients are averaged over MPI by a flat
    communicator that this one holds (``host``, made when first needed).
    """

    name = 'pure_nccl'

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        self.nccl_comm = None
        self.nccl_device = None
        # The event after the last NCCL work launched without a host wait;
        # whatever launches NCCL work waits for it first (wait_in_flight),
        # so that no work goes unwatched by the watchdog.
        self.in_flight = None
        self.host = None       # the flat communicator for NumPy gradients

    def init_nccl(self, device_id):
        """Create the NCCL communicator once, on ``device_id``."""
        if self.nccl_comm is not None:
            if device_id != self.nccl_device:
                raise RuntimeError(
                    '{}: NCCL was set up on GPU {} but the gradients now live '
                    'on GPU {}'.format(self.name, self.nccl_device, device_id))
            return
        check_one_gpu_per_rank(self.mpi_comm, device_id, self.name)
        self.nccl_comm = self.make_nccl_comm(device_id)
        self.nccl_device = device_id
        destroy_at_exit(self)

    def make_nccl_comm(self, device_id):
        """The NCCL communicator of this communicator's ranks."""
        return init_nccl_comm(self.mpi_comm, device_id)

    def mean_grads(self, model, entries, stream=None, tag='nccl',
                   check=True):
        first = entries[0][1].array
        if backend.get_array_module(first) is numpy:
            return self.host_comm().mean_grads(model, entries)
        self.wait_in_flight()
        device = backend.get_device_id(first)
        self.init_nccl(device)
        cupy = backend.get_cupy()
        nccl = nccl_module()
        wire_dtype = self.transfer_dtype(entries)
        packer = packing.Packer(entries)
        nbytes = packer.total * (2 if wire_dtype == BFLOAT16
                                 else numpy.dtype(wire_dtype).itemsize)
        with cupy.cuda.Device(device):
            stream = stream or cupy.cuda.get_current_stream()
            with stream:
                with hooks.span('pack', nbytes, sync=True):
                    buf, wire = self._pack_for_wire(model, packer,
                                                    wire_dtype, tag)
                with hooks.span('allreduce', nbytes, sync=True):
                    self.sum_on_device(nccl, wire, nccl_dtype(nccl,
                                                              wire_dtype),
                                       stream, timed=True)
                with hooks.span('unpack', nbytes, sync=True):
                    self._unpack_from_wire(packer, buf, wire, wire_dtype,
                                           check)
                self.in_flight = stream.record()

    def sum_on_device(self, nccl, wire, kind, stream, timed=False):
        """Sum the GPU array ``wire`` over all ranks in place (one NCCL
        allreduce); the hierarchical communicator overrides this step only.
        ``timed``: the step of a gradient averaging, whose stages (the
        hierarchical communicator has three) go into the timeline."""
        self.nccl_comm.allReduce(wire.data.ptr, wire.data.ptr, wire.size,
                                 kind, nccl.NCCL_SUM, stream.ptr)

    def host_comm(self):
        """The flat communicator (with this one's layers) that averages
        NumPy gradients over MPI; made at the first, collectively."""
        if self.host is None:
            dtype = self.allreduce_grad_dtype
            dtype = dtype if dtype in (numpy.float32, numpy.float64) else None
            self.host = with_layers(FlatCommunicator, self.layers)(
                self.mpi_comm, allreduce_grad_dtype=dtype)
        return self.host

    def _check_grad_dtype(self, dtype):
        if dtype is None:
            return None
        if dtype == BFLOAT16 or getattr(dtype, '__name__', '') == BFLOAT16:
            return BFLOAT16
        dtype = numpy.dtype(dtype)
        if dtype not in (numpy.float16, numpy.float32, numpy.float64):
            raise ValueError('{}: allreduce_grad_dtype must be None, float16, '
                             '"bfloat16", float32 or float64, got {}'
                             .format(self.name, dtype))
        return dtype

    def layout_extra(self, model):
        on_gpu = any(backend.get_device_id(p.array) >= 0
                     for _, p in model.namedparams() if p.array is not None)
        return [('(arrays on)', 'tag', 'gpu' if on_gpu else 'cpu')]

    def bucket_transport(self, device):
        if device < 0:
            return super().bucket_transport(device)
        from minichain.dist.nccl_buckets import NcclBuckets
        return NcclBuckets(self, device)

    # -- waiting for NCCL under the watchdog -----------------------------------
    # NCCL reports nothing to the host: a collective that some rank never
    # joins spins on the GPU, and the host hangs at its next synchronization,
    # outside the MPI watchdog. So every host wait on NCCL work polls an event
    # recorded after it, through the wire (with the guards: same stall
    # timeout, same report), and a stall aborts the NCCL communicator before
    # the job ends.

    def wait_nccl(self, event, what, wire=None):
        """Wait on the host until ``event`` (recorded after NCCL work) has
        passed, watched as an MPI collective is; ``what`` names the work."""
        self.wait_until(lambda: event.done, what, on_stall=self.abort_nccl,
                        wire=wire)

    def wait_in_flight(self):
        """Wait for the previous averaging's NCCL work (launched without a
        host wait): by the next averaging it has long finished, unless a
        rank never joined it, which the watchdog then reports."""
        event, self.in_flight = self.in_flight, None
        if event is not None:
            self.wait_nccl(event, 'the previous NCCL averaging')

    def abort_nccl(self):
        """ncclCommAbort: NCCL's kernels stop waiting for the other ranks.
        Returns a line for the watchdog's report."""
        nccl_comm, self.nccl_comm = self.nccl_comm, None
        if nccl_comm is None:
            return 'no NCCL communicator to abort'
        nccl_comm.abort()
        return 'aborted the NCCL communicator on rank {}'.format(self.rank)

    def allreduce(self, x, op='sum'):
        """Elementwise sum or mean of ``x`` over all ranks (see the MPI
        version). A CuPy float ``x`` is reduced on its GPU by NCCL, on the
        current stream: no copy through host memory and no wait for the GPU
        (the shape check is a host exchange). Other ops and dtypes go
        through host memory as in the other communicators.
        """
        if (backend.get_array_module(x) is numpy or op not in ('sum', 'mean')
                or x.dtype not in (numpy.float32, numpy.float64)):
            return super().allreduce(x, op)
        self.check_allreduce(x, op)
        cupy, nccl, _ = self._nccl_for(x)  # the previous NCCL work waited
        with cupy.cuda.Device(backend.get_device_id(x)):
            stream = cupy.cuda.get_current_stream()
            buf = cupy.array(x, copy=True, order='C')
            self.sum_on_device(nccl, buf, nccl_dtype(nccl, buf.dtype), stream)
            if op == 'mean':
                buf *= 1.0 / self.size
            self.in_flight = stream.record()
        return buf

    # -- the two halves of the allreduce on the GPU (shard_state) -------------
    def shard_bounds(self, n):
        """NCCL's ``reduceScatter`` and ``allGather`` move equal counts per
        rank: shards of ``ceil(n / N)`` elements, the last shorter (or
        empty), instead of sizes within one element of each other."""
        c = -(-n // self.size)
        return [min(r * c, n) for r in range(self.size + 1)]

    nccl_spans_every_rank = True  # (not the hierarchical one's)

    def _on_nccl(self, buf):
        return (self.nccl_spans_every_rank
                and backend.get_array_module(buf) is not numpy
                and buf.dtype in (numpy.float16, numpy.float32,
                                  numpy.float64))

    def reduce_scatter(self, buf):
        """See the base class; a CuPy float ``buf`` is reduced on its GPU by
        NCCL's ``reduceScatter`` on the current stream (from a copy padded
        to ``N`` equal shards)."""
        if not self._on_nccl(buf):
            return super().reduce_scatter(buf)
        with self.collective('reduce_scatter'):
            cupy, nccl, stream = self._nccl_for(buf)
            c = -(-buf.size // self.size)
            lo, hi = self.shard_bounds(buf.size)[self.rank:self.rank + 2]
            with cupy.cuda.Device(backend.get_device_id(buf)):
                padded = cupy.zeros(c * self.size, buf.dtype)
                padded[:buf.size] = buf
                mine = cupy.empty(c, buf.dtype)
                with hooks.span('reduce-scatter', buf.nbytes, sync=True):
                    self.nccl_comm.reduceScatter(
                        padded.data.ptr, mine.data.ptr, c,
                        nccl_dtype(nccl, buf.dtype), nccl.NCCL_SUM,
                        stream.ptr)
                buf[lo:hi] = mine[:hi - lo]
                self.in_flight = stream.record()

    def allgather_shards(self, buf):
        """See the base class; NCCL's ``allGather`` for a CuPy float
        ``buf``."""
        if not self._on_nccl(buf):
            return super().allgather_shards(buf)
        with self.collective('allgather_shards'):
            cupy, nccl, stream = self._nccl_for(buf)
            c = -(-buf.size // self.size)
            lo, hi = self.shard_bounds(buf.size)[self.rank:self.rank + 2]
            with cupy.cuda.Device(backend.get_device_id(buf)):
                mine = cupy.zeros(c, buf.dtype)
                mine[:hi - lo] = buf[lo:hi]
                every = cupy.empty(c * self.size, buf.dtype)
                with hooks.span('allgather', buf.nbytes, sync=True):
                    self.nccl_comm.allGather(
                        mine.data.ptr, every.data.ptr, c,
                        nccl_dtype(nccl, buf.dtype), stream.ptr)
                buf[...] = every[:buf.size]
                self.in_flight = stream.record()

    def _nccl_for(self, buf):
        """``(cupy, nccl, current stream)``, NCCL set up on ``buf``'s GPU
        and the previous NCCL work waited for (under the watchdog)."""
        self.wait_in_flight()
        self.init_nccl(backend.get_device_id(buf))
        cupy = backend.get_cupy()
        return cupy, nccl_module(), cupy.cuda.get_current_stream()

    def multi_node_mean_grad_async(self, model, zero_fill, stream, tag):
        """Enqueue the averaging of ``model``'s CuPy gradients on ``stream``
        and return without waiting (used by double buffering).

        The gradients become views of the buffer named ``tag``; they are
        valid once ``stream`` has finished. No inf/NaN check is made.
        """
        with self.collective('multi_node_mean_grad'):
            entries, _ = self.plan_grads(model, zero_fill)
        if entries:
            self.mean_grads(model, entries, stream, tag, check=False)

    def transfer_dtype(self, entries):
        """The dtype gradients travel in (``'bfloat16'`` for bfloat16)."""
        if self.allreduce_grad_dtype is not None:
            return self.allreduce_grad_dtype
        return packing.grad_dtype(entries)

    def _pack_for_wire(self, model, packer, wire_dtype, tag):
        """Pack scaled gradients; return ``(buffer, array sent on the wire)``
        (for bfloat16 the wire holds uint16 bit patterns)."""
        buf_dtype = numpy.float32 if wire_dtype == BFLOAT16 else wire_dtype
        buf = self.buffers.get(model, tag, packer.entries[0][1].array,
                               buf_dtype, packer.total)
        packer.pack(buf, 1.0 / self.size)
        if wire_dtype == BFLOAT16:
            return buf, to_bfloat16_bits(buf)
        return buf, buf

    def _unpack_from_wire(self, packer, buf, wire, wire_dtype, check=True):
        cupy = backend.get_cupy()
        if wire is not buf:
            buf[...] = from_bfloat16_bits(wire)
        if check and (buf.dtype.itemsize < 4 or wire is not buf):
            finite = cupy.isfinite(buf).all()
            self.wait_nccl(cupy.cuda.get_current_stream().record(),
                           'the NCCL allreduce')
            if not bool(finite):
                raise FloatingPointError(
                    '{}: the averaged gradients hold inf or NaN after the {} '
                    'allreduce (an overflow of the transfer dtype, or '
                    'non-finite gradients on some rank)'.format(
                        self.name, wire_dtype))
        packer.unpack(buf)

    def finalize(self):
        """Wait for the GPU, meet the other ranks, destroy the NCCL
        communicator, then release the MPI one if owned (as ChainerMN does).

        Collective: every rank calls it. The device synchronization covers
        every stream, so an allreduce still in flight (double buffering
        launches the last one on its own stream) ends before NCCL goes.
        Calling it again does nothing; a communicator not finalized is
        cleaned up at interpreter exit (see :func:`destroy_at_exit`).
        """
        self.destroy_nccl(barrier=True)
        if self.host is not None:
            self.host.finalize()
            self.host = None
        super().finalize()

    def destroy_nccl(self, barrier):
        """Destroy the NCCL communicator (after its work), once; with
        ``barrier``, after every rank got here."""
        if self.nccl_comm is None:
            return
        self.wait_in_flight()
        nccl_comm, self.nccl_comm = self.nccl_comm, None
        backend.get_cupy().cuda.Device(self.nccl_device).synchronize()
        if barrier and self.mpi_comm is not None and _mpi_running():
            self.mpi_comm.Barrier()
        nccl_comm.destroy()


def _mpi_running():
    from minichain.dist import mpi
    MPI = mpi.import_mpi()
    return MPI.Is_initialized() and not MPI.Is_finalized()


def destroy_at_exit(comm):
    """Destroy ``comm``'s NCCL communicator at interpreter exit unless
    ``finalize`` did it before.

    ``atexit`` runs handlers last-registered first: this one (registered
    when NCCL starts) runs before CuPy's exit handlers (registered at its
    import) and before mpi4py's MPI_Finalize (after every handler), so the
    GPU is synchronized while CUDA still works. Without it, garbage
    collection would destroy the NCCL communicator during shutdown, with
    the last allreduce possibly in flight. No barrier at exit: a rank
    leaving on an error (with the abort hook turned off) must not wait
    there for ranks that are still training. A weak reference, so that a
    dropped communicator is not kept alive.
    """
    atexit.register(_destroy_at_exit, weakref.ref(comm))


def _destroy_at_exit(ref):
    comm = ref()
    if comm is None:
        return
    try:
        comm.destroy_nccl(barrier=False)
    except Exception as e:  # never a traceback at exit
        print('minichain {}: NCCL teardown at exit failed: {}: {}'.format(
            comm.name, type(e).__name__, e), file=sys.stderr)
