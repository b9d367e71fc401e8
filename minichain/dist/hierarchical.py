"""The hierarchical communicator: NCCL inside a node, MPI between nodes."""
import numpy

from minichain import backend
from minichain.dist.transports import mpi
from minichain.dist.trace import timeline
from minichain.dist.guards import watchdog
from minichain.dist.pure_nccl import (PureNcclCommunicator,
                                      check_one_gpu_per_rank, destroy_at_exit,
                                      from_bfloat16_bits, nccl_module,
                                      to_bfloat16_bits)


def widen(host):
    """A host copy of a wire buffer in a dtype MPI can sum: bfloat16 bit
    patterns (uint16, see pure_nccl.to_bfloat16_bits) and float16 become
    float32."""
    if host.dtype == numpy.uint16:
        return from_bfloat16_bits(host)
    return host.astype(numpy.float32) if host.itemsize < 4 else host


def narrow(wide, dtype):
    """:func:`widen` undone, into the wire's ``dtype``."""
    if dtype == numpy.uint16:
        return to_bfloat16_bits(numpy.ascontiguousarray(wide))
    return wide.astype(dtype, copy=False)


class HierarchicalCommunicator(PureNcclCommunicator):
    """Three-stage allreduce for clusters whose nodes talk over a slower link.

    1. NCCL reduce of the packed, pre-scaled buffer onto the node's first
       rank (``intra_rank == 0``);
    2. MPI Allreduce of that buffer among the nodes' first ranks, staged
       through host memory (float16/bfloat16 widened to float32 there, since
       MPI cannot sum them);
    3. NCCL broadcast back inside the node.

    Nodes are told apart by MPI's processor name. NumPy gradients fall back
    to the flat (MPI) path.
    """

    name = 'hierarchical'
    # Its NCCL communicator spans one node: a sharded optimizer state's
    # reduce-scatter and allgather go through MPI (staged through the host).
    nccl_spans_every_rank = False

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        self._intra_mpi = self.mpi_comm.Split(self.inter_rank, self.intra_rank)
        # Ranks with the same intra_rank, one per node; only the
        # intra_rank == 0 one takes part in the inter-node allreduce.
        self._inter_mpi = self.mpi_comm.Split(self.intra_rank, self.inter_rank)
        self._inter_wire = watchdog.Wire(self._inter_mpi, 'hierarchical '
                                         '(between nodes)')
        self._inter_buckets = None

    def _init_nccl(self, device_id):
        if self._nccl_comm is not None:
            return super()._init_nccl(device_id)
        cupy = backend.get_cupy()
        nccl = nccl_module()
        check_one_gpu_per_rank(self.mpi_comm, device_id, self.name)
        uid = nccl.get_unique_id() if self.intra_rank == 0 else None
        uid = self._intra_mpi.bcast(uid, root=0)
        with cupy.cuda.Device(device_id):
            self._nccl_comm = nccl.NcclCommunicator(self.intra_size, uid,
                                                    self.intra_rank)
        self._nccl_device = device_id
        destroy_at_exit(self)

    def _sum_wire(self, nccl, wire, kind, stream, timed=False):
        """NCCL reduce to the node's first rank, MPI allreduce between the
        nodes' first ranks, NCCL broadcast back inside each node (each a
        timeline event inside the caller's 'allreduce' when ``timed``)."""
        span = timeline.span if timed else timeline.no_span
        with span('reduce', wire.nbytes, sync=True):
            self._nccl_comm.reduce(wire.data.ptr, wire.data.ptr, wire.size,
                                   kind, nccl.NCCL_SUM, 0, stream.ptr)
        if self.intra_rank == 0 and self.inter_size > 1:
            with span('allreduce_inter', wire.nbytes):
                self._inter_node_sum(wire, stream)
        with span('bcast', wire.nbytes, sync=True):
            self._nccl_comm.bcast(wire.data.ptr, wire.size, kind, 0,
                                  stream.ptr)

    def _inter_node_sum(self, wire, stream):
        """Sum ``wire`` over the nodes' first ranks through host memory."""
        MPI = mpi.import_mpi()
        self._wire.wait_until(lambda: stream.done, 'the NCCL reduce',
                              on_stall=self._abort_nccl)
        wide = widen(wire.get())
        mpi.allreduce_buffer(self._inter_wire, wide, MPI.SUM)
        wire.set(narrow(wide, wire.dtype))

    def _bucket_transport(self, device):
        if device < 0:
            return super()._bucket_transport(device)
        from minichain.dist.transports.nccl_buckets import HierarchicalBuckets
        return HierarchicalBuckets(self, device)

    def _bucket_inter_wire(self):
        """The Wire between nodes for overlapped buckets (its own, so that
        they never mix with other inter-node sums; created when first
        needed, collectively)."""
        if self._inter_buckets is None:
            self._inter_buckets = watchdog.Wire(
                self._inter_mpi, 'hierarchical buckets (between nodes)')
        return self._inter_buckets

    def finalize(self):
        """Destroy the NCCL communicator (as ``pure_nccl`` does), then free
        the inter-node wire and the intra/inter MPI communicators. Safe to
        call twice."""
        self._destroy_nccl(barrier=True)
        self._inter_wire.free()
        if self._inter_buckets is not None:
            self._inter_buckets.free()
            self._inter_buckets = None
        for comm in (self._intra_mpi, self._inter_mpi):
            if comm is not None:
                comm.Free()
        self._intra_mpi = self._inter_mpi = None
        super().finalize()
