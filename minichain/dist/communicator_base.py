"""CommunicatorBase: what every communicator shares.

A subclass only decides how the gradients of a model are averaged
(``_mean_grads``); ranks, parameter broadcast, the array and object
collectives, ``split`` and the safety checks live here. Every message goes
through the communicator's :class:`~minichain.dist.guards.watchdog.Wire`, and every
collective opens with the header of :mod:`minichain.dist.guards.agreement`.
"""
import numpy

from minichain import backend
from minichain.dist.transports import mpi, shm_files
from minichain.dist.guards import agreement, safety, watchdog
from minichain.dist.trace import timeline
from minichain.dist.transports.collectives import CollectivesMixin


class CommunicatorBase(CollectivesMixin):
    """Base class of the data-parallel communicators.

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm`` (default ``MPI.COMM_WORLD``).
        allreduce_grad_dtype: the dtype gradients are averaged in (None:
            their own; see :func:`minichain.dist.create_communicator`).

    Attributes:
        mpi_comm: the MPI communicator underneath.
        rank, size: this process's rank and the number of processes.
        intra_rank, intra_size: rank among, and number of, the processes on
            this node (nodes are told apart by MPI's processor name).
        inter_rank, inter_size: index of this node and number of nodes.
        overlap, bucket_mb: the defaults of the multi-node optimizers made
            with this communicator (see
            :func:`minichain.dist.create_communicator`).
    """

    name = None
    overlap = False
    bucket_mb = None
    can_overlap = True  # whether it has _bucket_transport

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        MPI = mpi.import_mpi()
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self._owns_mpi_comm = False
        self.allreduce_grad_dtype = self._check_grad_dtype(
            allreduce_grad_dtype)
        self._wire = watchdog.Wire(self.mpi_comm, self.name or type(
            self).__name__)
        self._buckets = None  # the Wire of overlapped buckets, when needed
        self._init_ranks(MPI.Get_processor_name())
        shm_files.release_after_init(self.mpi_comm, MPI.COMM_WORLD)
        safety.install_abort_hook()
        timeline.start_from_env(self)

    rank = property(lambda self: self.mpi_comm.rank)
    size = property(lambda self: self.mpi_comm.size)

    def __repr__(self):
        return '<{} rank {} of {}>'.format(type(self).__name__, self.rank,
                                           self.size)

    def _check_grad_dtype(self, dtype):
        if dtype is None:
            return None
        dtype = numpy.dtype(dtype)
        if dtype not in (numpy.float32, numpy.float64):
            raise ValueError(
                '{} communicator: allreduce_grad_dtype must be None, float32 '
                'or float64 (float16/bfloat16 transfer needs pure_nccl), got {}'
                .format(self.name, dtype))
        return dtype

    def _init_ranks(self, processor_name):
        names = self._wire.allgather_obj(processor_name)
        nodes = list(dict.fromkeys(names))  # in order of first rank
        mine = names[self.rank]
        same = [r for r, n in enumerate(names) if n == mine]
        self.intra_rank = same.index(self.rank)
        self.intra_size = len(same)
        self.inter_rank = nodes.index(mine)
        self.inter_size = len(nodes)

    # -- model-level operations -----------------------------------------------
    def bcast_data(self, model):
        """Copy rank 0's parameters and persistent values to every rank.

        Arrays are overwritten in place (their identity is kept); scalar
        persistents (e.g. a batch-norm sample count) are set on their link.

        Raises:
            ModelMismatchError: the models differ (on every rank).
            ValueError: a parameter is not initialized yet (run one forward
                pass first), on every rank.
        """
        with self._wire.collective('bcast_data'):
            self._bcast_data(model)

    def _bcast_data(self, model):
        params = list(model.namedparams())
        persistents = list(model.namedpersistents())
        safety.agree(self._wire, safety.param_layout(params)
                     + safety.persistent_layout(persistents), 'bcast_data')
        uninit = [n for n, p in params if p.array is None]
        if uninit:
            raise ValueError(
                'bcast_data: parameters {} are not initialized; run one '
                'forward pass (lazy initialization) before broadcasting'
                .format(', '.join(uninit)))
        arrays = [p.array for _, p in params]
        scalars = []
        for name, v in persistents:
            if backend.is_array(v):
                arrays.append(v)
            else:
                scalars.append(name)
        self._bcast_arrays(arrays)
        if scalars:
            values = self.bcast_obj([dict(persistents)[n] for n in scalars])
            if self.rank != 0:
                owners = dict(model.namedlinks())
                for name, value in zip(scalars, values):
                    path, attr = name.rsplit('/', 1)
                    setattr(owners[path or '/'], attr, value)

    def _bcast_arrays(self, arrays):
        """Overwrite ``arrays`` in place with rank 0's, in one message."""
        sizes = [a.size * a.dtype.itemsize for a in arrays]
        offsets = numpy.cumsum([0] + sizes)
        buf = numpy.empty(int(offsets[-1]), dtype=numpy.uint8)
        if self.rank == 0:
            for a, o, n in zip(arrays, offsets, sizes):
                buf[o:o + n] = mpi.as_bytes(mpi.to_host(a)[0])
        with timeline.span('bcast', buf.nbytes):
            mpi.bcast_buffer(self._wire, buf, 0)
        if self.rank != 0:
            for a, o, n in zip(arrays, offsets, sizes):
                value = buf[o:o + n].view(a.dtype).reshape(a.shape)
                xp = backend.get_array_module(a)
                xp.copyto(a, xp.asarray(value))

    def multi_node_mean_grad(self, model, zero_fill=False, step=None):
        """Replace every gradient of ``model`` by its mean over all ranks.

        Parameters are taken in ``model.namedparams()`` order (sorted by
        path), the same on every rank. A gradient that is None on every rank
        stays None (the optimizer skips it).

        Args:
            model: a Link whose gradients were computed by ``backward``.
            zero_fill: a gradient that is None on some ranks only counts as
                zeros there (and they receive the mean). Without it that case
                is a ValueError raised on every rank.
            step: a training step count that must be equal on every rank
                (e.g. ``optimizer.t``); None: not compared.

        Raises:
            ModelMismatchError: the models differ (on every rank).
            ValueError: see ``zero_fill``.
            CollectiveMismatchError: ``step`` differs between ranks.

        After the call ``param.grad`` may be a view of a buffer that the
        communicator reuses at its next call for this model: copy a gradient
        that must outlive the next step.
        """
        self._multi_node_mean_grad(model, zero_fill, step)

    def _multi_node_mean_grad(self, model, zero_fill, step=None,
                              active=None):
        """:meth:`multi_node_mean_grad`; returns the number of ranks that
        contributed (``active``: see :func:`safety.plan_grads`)."""
        with self._wire.collective('multi_node_mean_grad'):
            # The header is the step's first collective: a rank that arrives
            # early waits here for the slower one, so the timeline names it.
            with timeline.span('sync'):
                entries, n_active = safety.plan_grads(
                    self._wire, model.namedparams(), zero_fill,
                    self._layout_extra(model), step, active)
            if entries:
                self._mean_grads(model, entries)
        return n_active

    def _plan_grads(self, model, zero_fill):
        """The header of a gradient averaging as a collective of its own (for
        one enqueued on a GPU stream); returns the entries to average."""
        with self._wire.collective('multi_node_mean_grad'):
            return safety.plan_grads(self._wire, model.namedparams(),
                                     zero_fill, self._layout_extra(model))[0]

    def allreduce_grad(self, model, zero_fill=False):
        """ChainerMN's earlier name of :meth:`multi_node_mean_grad`."""
        self.multi_node_mean_grad(model, zero_fill)

    def _layout_extra(self, model):
        """Extra ``(label, 'tag', text)`` entries that every rank must agree
        on before averaging (none here; NCCL adds the array device kind)."""
        return ()

    def _mean_grads(self, model, entries):
        """Average ``[(path, param, grad_or_None)]`` over ranks and set each
        ``param.grad`` (None contributes zeros)."""
        raise NotImplementedError(type(self).__name__ + '._mean_grads')

    def _bucket_wire(self):
        """The Wire of the overlapped averaging's buckets
        (:mod:`minichain.dist.averaging.overlap`): a duplicate of its own, so that
        buckets in flight during backward never mix with the collectives
        that backward makes on this communicator. Created when first
        needed, collectively (by every rank's first averaging)."""
        if self._buckets is None:
            self._buckets = watchdog.Wire(self.mpi_comm, '{} buckets'.format(
                self.name or type(self).__name__))
        return self._buckets

    def _bucket_transport(self, device):
        """How this communicator reduces an overlapped bucket whose arrays
        live on ``device`` (-1: the host): over MPI here."""
        from minichain.dist.transports.mpi_buckets import MpiBuckets
        return MpiBuckets(self._bucket_wire(), device,
                          self.allreduce_grad_dtype)

    # -- the two halves of an allreduce, for a sharded optimizer state --------
    def shard_bounds(self, n):
        """Where each rank's shard of an ``n``-element packed buffer starts,
        and the end: rank ``r`` owns ``bounds[r]:bounds[r + 1]`` (sizes
        differ by at most one element; see
        :mod:`minichain.dist.averaging.sharded`)."""
        return [r * n // self.size for r in range(self.size + 1)]

    def reduce_scatter(self, buf):
        """Sum the 1-d NumPy or CuPy array ``buf`` over all ranks, but only
        this rank's shard of it: afterwards ``buf[lo:hi]`` (``lo, hi`` this
        rank's :meth:`shard_bounds`) holds the sum, the rest is undefined.
        Collective; every rank passes the same length and dtype (the
        sharded averaging checked the model layout just before)."""
        with self._wire.collective('reduce_scatter'):
            host, on_gpu = mpi.to_host(buf)
            with timeline.span('reduce-scatter', host.nbytes):
                self._reduce_scatter_host(host)
            if on_gpu:  # only the shard comes back
                lo, hi = self.shard_bounds(buf.size)[self.rank:self.rank + 2]
                buf[lo:hi] = backend.to_gpu(host[lo:hi])

    def allgather_shards(self, buf):
        """The other half: each rank's shard of the 1-d array ``buf`` (its
        :meth:`shard_bounds`) copied into every rank's ``buf``, in place.
        Collective."""
        with self._wire.collective('allgather_shards'):
            host, on_gpu = mpi.to_host(buf)
            with timeline.span('allgather', host.nbytes):
                self._allgather_host(host)
            if on_gpu:
                buf[...] = backend.to_gpu(host)

    def _reduce_scatter_host(self, host):
        """:meth:`reduce_scatter` of a host array: MPI's ``Reduce_scatter``
        (the ring communicator runs its own first phase instead). MPI
        counts are C ints: a shard holds fewer than 2**31 elements."""
        MPI = mpi.import_mpi()
        bounds = self.shard_bounds(host.size)
        lo, hi = bounds[self.rank], bounds[self.rank + 1]
        # in place, MPI leaves the shard at the start of the buffer
        self._wire.Reduce_scatter(MPI.IN_PLACE, host, list(numpy.diff(
            bounds)), MPI.SUM)
        if lo:
            host[lo:hi] = host[:hi - lo].copy()

    def _allgather_host(self, host):
        """:meth:`allgather_shards` of a host array: MPI's ``Allgatherv``
        in place, as bytes (the ring runs its second phase instead)."""
        MPI = mpi.import_mpi()
        bounds = numpy.array(self.shard_bounds(host.size)) * host.itemsize
        self._wire.Allgatherv(MPI.IN_PLACE, [mpi.as_bytes(host), list(
            numpy.diff(bounds)), list(bounds[:-1]), MPI.BYTE])

    def raise_everywhere(self, error):
        """Raise ``error`` on every rank (see
        :func:`minichain.dist.guards.agreement.raise_everywhere`): the others
        raise it in the collective they are in or enter next."""
        agreement.raise_everywhere(self._wire, error)

    # -- communicator management ----------------------------------------------
    def split(self, color, key):
        """A communicator of the same kind over the ranks with equal ``color``,
        ordered by ``key`` (MPI_Comm_split)."""
        with self._wire.collective('split'):
            self._header()
            mpi_sub = self.mpi_comm.Split(color, key)
        sub = type(self)(mpi_sub,
                         allreduce_grad_dtype=self.allreduce_grad_dtype)
        sub._owns_mpi_comm = True
        sub.overlap, sub.bucket_mb = self.overlap, self.bucket_mb
        return sub

    def finalize(self):
        """Release what this communicator holds (sub-communicators it
        created) and write the timeline this communicator started (see
        :mod:`minichain.dist.trace.timeline`). MPI itself is finalized by mpi4py
        at exit."""
        timeline.finish_owned(self)
        for wire in (self._buckets, self._wire):
            if wire is not None:
                wire.free()
        self._wire = self._buckets = None
        if self._owns_mpi_comm and self.mpi_comm is not None:
            self.mpi_comm.Free()
            self.mpi_comm = None
