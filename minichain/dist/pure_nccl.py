"""The pure_nccl communicator: gradients averaged on the GPUs by NCCL.

CuPy and NCCL are reached only through ``minichain.backend`` and only when a
GPU gradient is first averaged, so importing this module needs neither.
"""
import atexit
import sys
import weakref

import numpy

from minichain import backend
from minichain.dist.transports import mpi, packing
from minichain.dist.guards import safety
from minichain.dist.trace import timeline
from minichain.dist.flat import FlatCommunicator

BFLOAT16 = 'bfloat16'


def nccl_module():
    """``cupy.cuda.nccl``, or a RuntimeError saying what is missing: CuPy
    or a GPU (the backend's error), or NCCL."""
    backend.check_cuda_available()
    try:
        return backend.get_nccl()
    except RuntimeError as e:
        raise RuntimeError('pure_nccl: {}'.format(e)) from e


def nccl_dtype(nccl, dtype):
    """The NCCL type constant for a NumPy dtype (or ``'bfloat16'``)."""
    name = BFLOAT16 if dtype == BFLOAT16 else numpy.dtype(dtype).name
    attr = {'float16': 'NCCL_FLOAT16', 'float32': 'NCCL_FLOAT32',
            'float64': 'NCCL_FLOAT64', 'bfloat16': 'NCCL_BFLOAT16',
            'uint8': 'NCCL_UINT8'}.get(name)
    if attr is None or not hasattr(nccl, attr):
        raise RuntimeError('pure_nccl: this NCCL cannot reduce {}'.format(name))
    return getattr(nccl, attr)


def check_one_gpu_per_rank(mpi_comm, device_id, where):
    """Raise on every rank when two ranks would drive the same GPU.

    NCCL needs one GPU per rank; ranks that never selected a device all sit
    on GPU 0, which this catches before NCCL hangs or fails obscurely.
    """
    from minichain.device import gpu_bus_id
    MPI = mpi.import_mpi()
    bus = gpu_bus_id(device_id)
    keys = mpi_comm.allgather((MPI.Get_processor_name(), bus, device_id))
    seen = {}
    for r, key in enumerate(keys):
        seen.setdefault(key[:2], []).append(r)
    shared = [(key, ranks) for key, ranks in seen.items() if len(ranks) > 1]
    if shared:
        (node, bus_id), ranks = shared[0]
        raise RuntimeError(
            '{}: {} all use GPU {} (bus {}) on node {}; NCCL needs one GPU per '
            'rank. Select a device per rank before creating the model: '
            'device = minichain.device.get_rank_device(comm.intra_rank, '
            'comm.intra_size); model.to_device(device)'.format(
                where, safety.format_ranks(ranks), keys[ranks[0]][2], bus_id,
                node))


def _mpi_running():
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
        comm._destroy_nccl(barrier=False)
    except Exception as e:  # never a traceback at exit
        print('minichain {}: NCCL teardown at exit failed: {}: {}'.format(
            comm.name, type(e).__name__, e), file=sys.stderr)


def to_bfloat16_bits(x32):
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even.

    NaN stays NaN (quiet, same sign): the rounding bias would carry a NaN's
    mantissa into the exponent, so that CUDA's canonical NaN 0x7FFFFFFF
    wraps to 0x8000 (-0.0), 0xFFFFFFFF to 0x0000 and a NaN with only low
    mantissa bits rounds to inf, and the finite check after the allreduce
    would pass over them.
    """
    xp = backend.get_array_module(x32)
    bits = x32.view(xp.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(xp.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    quiet = ((bits >> 16) | 0x0040).astype(xp.uint16)
    return xp.where(nan, quiet, rounded)


def from_bfloat16_bits(b16):
    """bfloat16 bit patterns (uint16) -> float32."""
    xp = backend.get_array_module(b16)
    return (b16.astype(xp.uint32) << 16).view(xp.float32)


class PureNcclCommunicator(FlatCommunicator):
    """Averages CuPy gradients with one NCCL allreduce of a packed buffer.

    Rank 0 creates the NCCL unique ID and broadcasts it over MPI; every rank
    builds its NCCL communicator lazily, at the first GPU allreduce, on the
    device holding the gradients (after the user selected it: device =
    ``comm.intra_rank`` by convention). Gradients are scaled by ``1/size``
    while packed, so the sum is already the mean: in a float16 or bfloat16
    transfer (``allreduce_grad_dtype``) no partial sum exceeds the mean's
    magnitude, and the result is checked for inf/NaN. NumPy gradients fall
    back to the flat (MPI) path.
    """

    name = 'pure_nccl'

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        self._nccl_comm = None
        self._nccl_device = None
        self._in_flight = None  # event after the last averaging's NCCL work

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

    def _layout_extra(self, model):
        on_gpu = any(backend.get_device_id(p.array) >= 0
                     for _, p in model.namedparams() if p.array is not None)
        return [('(arrays on)', 'tag', 'gpu' if on_gpu else 'cpu')]

    def _bucket_transport(self, device):
        if device < 0:
            return super()._bucket_transport(device)
        from minichain.dist.transports.nccl_buckets import NcclBuckets
        return NcclBuckets(self, device)

    def _init_nccl(self, device_id):
        """Create the NCCL communicator once, on ``device_id``."""
        if self._nccl_comm is not None:
            if device_id != self._nccl_device:
                raise RuntimeError(
                    '{}: NCCL was set up on GPU {} but the gradients now live '
                    'on GPU {}'.format(self.name, self._nccl_device, device_id))
            return
        cupy = backend.get_cupy()
        nccl = nccl_module()
        check_one_gpu_per_rank(self.mpi_comm, device_id, self.name)
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = self.mpi_comm.bcast(uid, root=0)
        with cupy.cuda.Device(device_id):
            self._nccl_comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._nccl_device = device_id
        destroy_at_exit(self)

    # -- waiting for NCCL under the watchdog -----------------------------------
    # NCCL reports nothing to the host: a collective that some rank never
    # joins spins on the GPU, and the host hangs at its next synchronization,
    # outside the MPI watchdog. So every host wait on NCCL work polls an event
    # recorded after it, through the Wire (same stall timeout, same report),
    # and a stall aborts the NCCL communicator before the job ends.

    def _wait_nccl(self, event, what, wire=None):
        """Wait on the host until ``event`` (recorded after NCCL work) has
        passed, watched as an MPI collective is; ``what`` names the work."""
        (wire or self._wire).wait_until(lambda: event.done, what,
                                        on_stall=self._abort_nccl)

    def _wait_in_flight(self):
        """Wait for the previous averaging's NCCL work (launched without a
        host wait): by the next averaging it has long finished, unless a
        rank never joined it, which the watchdog then reports."""
        event, self._in_flight = self._in_flight, None
        if event is not None:
            self._wait_nccl(event, 'the previous NCCL averaging')

    def _abort_nccl(self):
        """ncclCommAbort: NCCL's kernels stop waiting for the other ranks.
        Returns a line for the watchdog's report."""
        nccl_comm, self._nccl_comm = self._nccl_comm, None
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
        self._check_allreduce(x, op)
        device = backend.get_device_id(x)
        self._init_nccl(device)
        cupy = backend.get_cupy()
        nccl = nccl_module()
        with cupy.cuda.Device(device):
            buf = cupy.array(x, copy=True, order='C')
            self._sum_wire(nccl, buf, nccl_dtype(nccl, buf.dtype),
                           cupy.cuda.get_current_stream())
            if op == 'mean':
                buf *= 1.0 / self.size
            self._in_flight = cupy.cuda.get_current_stream().record()
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
        with self._wire.collective('reduce_scatter'):
            cupy, nccl, stream = self._nccl_for(buf)
            c = -(-buf.size // self.size)
            lo, hi = self.shard_bounds(buf.size)[self.rank:self.rank + 2]
            with cupy.cuda.Device(backend.get_device_id(buf)):
                padded = cupy.zeros(c * self.size, buf.dtype)
                padded[:buf.size] = buf
                mine = cupy.empty(c, buf.dtype)
                with timeline.span('reduce-scatter', buf.nbytes, sync=True):
                    self._nccl_comm.reduceScatter(
                        padded.data.ptr, mine.data.ptr, c,
                        nccl_dtype(nccl, buf.dtype), nccl.NCCL_SUM,
                        stream.ptr)
                buf[lo:hi] = mine[:hi - lo]
                self._in_flight = stream.record()

    def allgather_shards(self, buf):
        """See the base class; NCCL's ``allGather`` for a CuPy float
        ``buf``."""
        if not self._on_nccl(buf):
            return super().allgather_shards(buf)
        with self._wire.collective('allgather_shards'):
            cupy, nccl, stream = self._nccl_for(buf)
            c = -(-buf.size // self.size)
            lo, hi = self.shard_bounds(buf.size)[self.rank:self.rank + 2]
            with cupy.cuda.Device(backend.get_device_id(buf)):
                mine = cupy.zeros(c, buf.dtype)
                mine[:hi - lo] = buf[lo:hi]
                every = cupy.empty(c * self.size, buf.dtype)
                with timeline.span('allgather', buf.nbytes, sync=True):
                    self._nccl_comm.allGather(
                        mine.data.ptr, every.data.ptr, c,
                        nccl_dtype(nccl, buf.dtype), stream.ptr)
                buf[...] = every[:buf.size]
                self._in_flight = stream.record()

    def _nccl_for(self, buf):
        """``(cupy, nccl, current stream)``, NCCL set up on ``buf``'s GPU
        and the previous NCCL work waited for (under the watchdog)."""
        self._wait_in_flight()
        self._init_nccl(backend.get_device_id(buf))
        cupy = backend.get_cupy()
        return cupy, nccl_module(), cupy.cuda.get_current_stream()

    def multi_node_mean_grad_async(self, model, zero_fill, stream, tag):
        """Enqueue the averaging of ``model``'s CuPy gradients on ``stream``
        and return without waiting (used by double buffering).

        The gradients become views of the buffer named ``tag``; they are
        valid once ``stream`` has finished. No inf/NaN check is made.
        """
        entries = self._plan_grads(model, zero_fill)
        if entries:
            self._mean_grads(model, entries, stream, tag, check=False)

    def _mean_grads(self, model, entries, stream=None, tag='nccl',
                    check=True):
        first = entries[0][1].array
        if backend.get_array_module(first) is numpy:
            return super()._mean_grads(model, entries)
        self._wait_in_flight()
        device = backend.get_device_id(first)
        self._init_nccl(device)
        cupy = backend.get_cupy()
        nccl = nccl_module()
        wire_dtype = self._wire_dtype(entries)
        packer = packing.Packer(entries)
        nbytes = packer.total * (2 if wire_dtype == BFLOAT16
                                 else numpy.dtype(wire_dtype).itemsize)
        with cupy.cuda.Device(device):
            stream = stream or cupy.cuda.get_current_stream()
            with stream:
                with timeline.span('pack', nbytes, sync=True):
                    buf, wire = self._pack_for_wire(model, packer,
                                                    wire_dtype, tag)
                with timeline.span('allreduce', nbytes, sync=True):
                    self._sum_wire(nccl, wire, nccl_dtype(nccl, wire_dtype),
                                   stream, timed=True)
                with timeline.span('unpack', nbytes, sync=True):
                    self._unpack_from_wire(packer, buf, wire, wire_dtype,
                                           check)
                self._in_flight = stream.record()

    def _sum_wire(self, nccl, wire, kind, stream, timed=False):
        """Sum ``wire`` over all ranks in place (one NCCL allreduce); the
        hierarchical communicator overrides this step only. ``timed``: the
        step of a gradient averaging, whose stages (the hierarchical
        communicator has three) go into the timeline."""
        self._nccl_comm.allReduce(wire.data.ptr, wire.data.ptr, wire.size,
                                  kind, nccl.NCCL_SUM, stream.ptr)

    def _wire_dtype(self, entries):
        if self.allreduce_grad_dtype is not None:
            return self.allreduce_grad_dtype
        return packing.grad_dtype(entries)

    def _pack_for_wire(self, model, packer, wire_dtype, tag):
        """Pack scaled gradients; return ``(buffer, array sent on the wire)``
        (for bfloat16 the wire holds uint16 bit patterns)."""
        buf_dtype = numpy.float32 if wire_dtype == BFLOAT16 else wire_dtype
        buf = self._buffers.get(model, tag, backend.get_cupy(), buf_dtype,
                                packer.total)
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
            self._wait_nccl(cupy.cuda.get_current_stream().record(),
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
        cleaned up at interpreter exit (see :func:`_destroy_at_exit`).
        """
        self._destroy_nccl(barrier=True)
        super().finalize()

    def _destroy_nccl(self, barrier):
        if self._nccl_comm is None:
            return
        self._wait_in_flight()
        nccl_comm, self._nccl_comm = self._nccl_comm, None
        backend.get_cupy().cuda.Device(self._nccl_device).synchronize()
        if barrier and self.mpi_comm is not None and _mpi_running():
            self.mpi_comm.Barrier()
        nccl_comm.destroy()
