"""The hierarchical communicator: NCCL inside a node, MPI between nodes."""
from minichain.dist import hooks, mpi
from minichain.dist.nccl import narrow, widen
from minichain.dist.pure_nccl import PureNcclCommunicator, init_nccl_comm


class HierarchicalCommunicator(PureNcclCommunicator):
    """Three-stage allreduce for clusters whose nodes talk over a slower link.

    1. NCCL reduce of the packed, pre-scaled buffer onto the node's first
       rank (``intra_rank == 0``);
    2. MPI Allreduce of that buffer among the nodes' first ranks, staged
       through host memory (float16/bfloat16 widened to float32 there, since
       MPI cannot sum them);
    3. NCCL broadcast back inside the node.

    Nodes are told apart by MPI's processor name. NumPy gradients are
    averaged over MPI (as by pure_nccl).
    """

    name = 'hierarchical'
    # Its NCCL communicator spans one node: a sharded optimizer state's
    # reduce-scatter and allgather go through MPI (staged through the host).
    nccl_spans_every_rank = False

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        self.intra_mpi = self.mpi_comm.Split(self.inter_rank, self.intra_rank)
        # Ranks with the same intra_rank, one per node; only the
        # intra_rank == 0 one takes part in the inter-node allreduce.
        self.inter_mpi = self.mpi_comm.Split(self.intra_rank, self.inter_rank)
        self.inter_wire = self.make_wire(self.inter_mpi, 'hierarchical '
                                         '(between nodes)')
        self._inter_buckets = None

    def make_nccl_comm(self, device_id):
        """NCCL inside the node: the unique ID from the node's first rank."""
        return init_nccl_comm(self.intra_mpi, device_id)

    def sum_on_device(self, nccl, wire, kind, stream, timed=False):
        """NCCL reduce to the node's first rank, MPI allreduce between the
        nodes' first ranks, NCCL broadcast back inside each node (each a
        timeline event inside the caller's 'allreduce' when ``timed``)."""
        span = hooks.span if timed else hooks.no_span
        with span('reduce', wire.nbytes, sync=True):
            self.nccl_comm.reduce(wire.data.ptr, wire.data.ptr, wire.size,
                                  kind, nccl.NCCL_SUM, 0, stream.ptr)
        if self.intra_rank == 0 and self.inter_size > 1:
            with span('allreduce_inter', wire.nbytes):
                self._inter_node_sum(wire, stream)
        with span('bcast', wire.nbytes, sync=True):
            self.nccl_comm.bcast(wire.data.ptr, wire.size, kind, 0,
                                 stream.ptr)

    def _inter_node_sum(self, wire, stream):
        """Sum ``wire`` over the nodes' first ranks through host memory."""
        MPI = mpi.import_mpi()
        self.wait_until(lambda: stream.done, 'the NCCL reduce',
                        on_stall=self.abort_nccl)
        wide = widen(wire.get())
        mpi.allreduce_buffer(self.inter_wire, wide, MPI.SUM)
        wire.set(narrow(wide, wire.dtype))

    def bucket_transport(self, device):
        if device < 0:
            return super().bucket_transport(device)
        from minichain.dist.nccl_buckets import HierarchicalBuckets
        return HierarchicalBuckets(self, device)

    def bucket_inter_wire(self):
        """The wire between nodes for overlapped buckets (its own, so that
        they never mix with other inter-node sums; created when first
        needed, collectively)."""
        if self._inter_buckets is None:
            self._inter_buckets = self.make_wire(
                self.inter_mpi, 'hierarchical buckets (between nodes)')
        return self._inter_buckets

    def finalize(self):
        """Destroy the NCCL communicator (as ``pure_nccl`` does), then free
        the inter-node wires and the intra/inter MPI communicators. Safe to
        call twice."""
        self.destroy_nccl(barrier=True)
        for wire in (self.inter_wire, self._inter_buckets):
            if wire is not None:
                self.free_wire(wire)
        self.inter_wire = self._inter_buckets = None
        for comm in (self.intra_mpi, self.inter_mpi):
            if comm is not None:
                comm.Free()
        self.intra_mpi = self.inter_mpi = None
        super().finalize()
