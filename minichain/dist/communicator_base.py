"""CommunicatorBase: ranks, a wire, and the averaging every communicator
shares (a subclass says how: flat.py packs, allreduces, unpacks). The
layers (hooks.layers: the guards, the timeline, the shared-memory sum)
replace some of its methods, the "hooks" below (docs/dist.md, "The
layers"); ``layers=()`` leaves the bare protocol.
"""
import functools

import numpy

from minichain import backend
from minichain.dist import mpi, packing
from minichain.dist.collectives import CollectivesMixin
from minichain.dist.failures import raise_failures
from minichain.dist.wire import Wire


class CommunicatorBase(CollectivesMixin):
    """Base class of the data-parallel communicators.

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm`` (default ``MPI.COMM_WORLD``).
        allreduce_grad_dtype: the dtype gradients are averaged in (None:
            their own; see :func:`minichain.dist.create_communicator`).
    """

    name = None

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        MPI = mpi.import_mpi()
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.wire = self.make_wire(self.mpi_comm, self.label())
        self.allreduce_grad_dtype = self._check_grad_dtype(
            allreduce_grad_dtype)
        self.buffers = packing.BufferCache()
        self._owns_mpi_comm = False
        self._buckets = None  # the wire of overlapped buckets, when needed
        self._init_ranks(self.mpi_comm.allgather(MPI.Get_processor_name()))

    rank = property(lambda self: self.mpi_comm.rank)
    size = property(lambda self: self.mpi_comm.size)

    def multi_node_mean_grad(self, model, zero_fill=False, step=None):
        """Replace every gradient of ``model`` by its mean over all ranks
        (parameters in ``model.namedparams()`` order, the same everywhere).
        The guards raise on every rank: ModelMismatchError, ValueError
        (``zero_fill``), CollectiveMismatchError (``step``)."""
        self.average_grads(model, zero_fill, step)

    def average_grads(self, model, zero_fill=False, step=None, active=None):
        """As above; returns how many ranks contributed (``active``: this
        rank still has data, in ``dist.join``). ``param.grad`` may become a
        view of a buffer reused next call."""
        with self.collective('multi_node_mean_grad'):
            entries, n = self.plan_grads(model, zero_fill, step, active)
            if entries:
                self.mean_grads(model, entries)
        return n

    def plan_grads(self, model, zero_fill=False, step=None, active=None):
        """``([(path, param, grad_or_None)], n_active)``: what to average.
        Bare: every initialized parameter, every rank active; the guards
        agree on it first (guards/safety.py, ``plan_grads``).
        """
        return [(n, p, p.grad) for n, p in model.namedparams()
                if p.array is not None], self.size

    def mean_grads(self, model, entries):
        """Average ``[(path, param, grad_or_None)]`` over ranks and set each
        ``param.grad`` (None contributes zeros)."""
        raise NotImplementedError(type(self).__name__ + '.mean_grads')

    # Attributes (besides mpi_comm, wire, rank and size): intra_rank and
    # intra_size, this process's rank among, and the number of, the
    # processes on its node (told apart by MPI's processor name);
    # inter_rank and inter_size, the index of its node and the number of
    # nodes; overlap and bucket_mb, the defaults of the multi-node
    # optimizers made with it; layers, the layer classes in front of it
    # (see with_layers).
    overlap = False
    bucket_mb = None
    can_overlap = True  # whether it has bucket_transport
    layers = ()
    Packer = packing.Packer  # the tracing layer times pack and unpack

    def bcast_data(self, model):
        """Copy rank 0's parameters and persistent values to every rank.

        Arrays are overwritten in place (their identity is kept); scalar
        persistents (e.g. a batch-norm sample count) are set on their link.

        Raises:
            ModelMismatchError: the models differ (with the guards).
            ValueError: a parameter is not initialized yet (run one forward
                pass first), on every rank.
        """
        params = list(model.namedparams())
        uninit = [n for n, p in params if p.array is None]
        if uninit:
            raise ValueError(
                'bcast_data: parameters {} are not initialized; run one '
                'forward pass (lazy initialization) before broadcasting'
                .format(', '.join(uninit)))
        persistents = list(model.namedpersistents())
        arrays = [p.array for _, p in params]
        arrays += [v for _, v in persistents if backend.is_array(v)]
        self._bcast_arrays(arrays)
        scalars = [n for n, v in persistents if not backend.is_array(v)]
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
        self.bcast_packed(buf)
        if self.rank != 0:
            for a, o, n in zip(arrays, offsets, sizes):
                value = buf[o:o + n].view(a.dtype).reshape(a.shape)
                xp = backend.get_array_module(a)
                xp.copyto(a, xp.asarray(value))

    def bcast_packed(self, buf):
        """Broadcast the host byte buffer ``buf`` from rank 0, in place."""
        mpi.bcast_buffer(self.wire, buf, 0)

    # -- hooks: what the guards replace --------------------------------------
    def label(self):
        """How reports name this communicator (``'flat'``)."""
        return self.name or type(self).__name__

    def make_wire(self, mpi_comm, label):
        """What messages over ``mpi_comm`` go through: a plain
        :class:`~minichain.dist.wire.Wire` (the guards: a watched one)."""
        return Wire(mpi_comm, label)

    def free_wire(self, wire):
        """Release what :meth:`make_wire` made."""
        wire.free()

    def collective(self, kind):
        """Bracket one collective (a ``with`` block): the wire's (the
        guards number it, for the header and the stall reports)."""
        return self.wire.collective(kind)

    def header(self, agree=None, on_mismatch=None, maxes=(), root=None,
               root_values=()):
        """The values a collective's ranks exchange before the data: the
        max of ``maxes`` and rank ``root``'s ``root_values`` (as
        :func:`minichain.dist.guards.agreement.header`, which the guards
        call instead, also agreeing on ``agree``). Returns both, as
        tuples of ints."""
        raise_failures([agree])  # a local error, raised here only
        MPI = mpi.import_mpi()
        if maxes:
            v = numpy.array(maxes, numpy.int64)
            self.wire.Allreduce(MPI.IN_PLACE, v, op=MPI.MAX)
            maxes = v.tolist()
        if root is not None:
            root_values = tuple(self.wire.bcast(tuple(root_values), root))
        return tuple(int(x) for x in maxes), tuple(int(x) for x in root_values)

    def agree_layout(self, wire, layout, where, step=None):
        """Inside a collective of ``wire``: what its ranks must hold equal
        (a model's layout, the training ``step``). Nothing here; the guards
        compare it (ModelMismatchError on every rank)."""

    def wait_until(self, done, what, on_stall=None, wire=None):
        """Wait until ``done()`` holds (e.g. a CUDA event has passed);
        ``what`` names it (the guards watch the wait as an MPI call's)."""
        (wire or self.wire).wait_until(done, what, on_stall)

    def wait_request(self, request):
        """Wait for a non-blocking point-to-point ``request`` on the wire
        (the ring's steps); the guards watch the wait (the stall timeout)."""
        self.wire.wait(request)

    def raise_everywhere(self, error):
        """Raise ``error`` on every rank (with the guards: see
        :func:`minichain.dist.guards.agreement.raise_everywhere`; bare, here
        only)."""
        raise error

    # -- the rest -------------------------------------------------------------
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

    def _init_ranks(self, names):
        nodes = list(dict.fromkeys(names))  # in order of first rank
        mine = names[self.rank]
        same = [r for r, n in enumerate(names) if n == mine]
        self.intra_rank = same.index(self.rank)
        self.intra_size = len(same)
        self.inter_rank = nodes.index(mine)
        self.inter_size = len(nodes)

    def allreduce_grad(self, model, zero_fill=False):
        """ChainerMN's earlier name of :meth:`multi_node_mean_grad`."""
        self.multi_node_mean_grad(model, zero_fill)

    def broadcast_data(self, model):
        """ChainerMN's earlier name of :meth:`bcast_data`."""
        self.bcast_data(model)

    def layout_extra(self, model):
        """Extra ``(label, 'tag', text)`` entries that every rank must agree
        on before averaging (none here; NCCL adds the array device kind)."""
        return ()

    def bucket_wire(self):
        """The wire of the overlapped averaging's buckets
        (:mod:`minichain.dist.averaging.overlap`): a duplicate of its own, so
        that buckets in flight during backward never mix with the
        collectives that backward makes on this communicator. Created when
        first needed, collectively (by every rank's first averaging)."""
        if self._buckets is None:
            self._buckets = self.make_wire(
                self.mpi_comm, '{} buckets'.format(self.label()))
        return self._buckets

    def bucket_transport(self, device):
        """How this communicator reduces an overlapped bucket whose arrays
        live on ``device`` (-1: the host): over MPI here."""
        from minichain.dist.mpi_buckets import MpiBuckets
        return MpiBuckets(self.bucket_wire(), device,
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
        with self.collective('reduce_scatter'):
            host, on_gpu = mpi.to_host(buf)
            self._reduce_scatter_host(host)
            if on_gpu:  # only the shard comes back
                lo, hi = self.shard_bounds(buf.size)[self.rank:self.rank + 2]
                buf[lo:hi] = backend.to_gpu(host[lo:hi])

    def allgather_shards(self, buf):
        """The other half: each rank's shard of the 1-d array ``buf`` (its
        :meth:`shard_bounds`) copied into every rank's ``buf``, in place.
        Collective."""
        with self.collective('allgather_shards'):
            host, on_gpu = mpi.to_host(buf)
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
        self.wire.Reduce_scatter(MPI.IN_PLACE, host, list(numpy.diff(
            bounds)), MPI.SUM)
        if lo:
            host[lo:hi] = host[:hi - lo].copy()

    def _allgather_host(self, host):
        """:meth:`allgather_shards` of a host array: MPI's ``Allgatherv``
        in place, as bytes (the ring runs its second phase instead)."""
        MPI = mpi.import_mpi()
        bounds = numpy.array(self.shard_bounds(host.size)) * host.itemsize
        self.wire.Allgatherv(MPI.IN_PLACE, [mpi.as_bytes(host), list(
            numpy.diff(bounds)), list(bounds[:-1]), MPI.BYTE])

    # -- communicator management ----------------------------------------------
    def split(self, color, key):
        """A communicator of the same kind over the ranks with equal ``color``,
        ordered by ``key`` (MPI_Comm_split)."""
        sub = type(self)(self.mpi_comm.Split(color, key),
                         allreduce_grad_dtype=self.allreduce_grad_dtype)
        sub._owns_mpi_comm = True
        sub.overlap, sub.bucket_mb = self.overlap, self.bucket_mb
        return sub

    def finalize(self):
        """Release what this communicator holds (its wires, sub-communicators
        it created). MPI itself is finalized by mpi4py at exit."""
        for wire in (self._buckets, self.wire):
            if wire is not None:
                self.free_wire(wire)
        self.wire = self._buckets = None
        if self._owns_mpi_comm and self.mpi_comm is not None:
            self.mpi_comm.Free()
            self.mpi_comm = None


@functools.lru_cache(maxsize=None)
def with_layers(cls, layers):
    """``cls`` with the layer classes ``layers`` in front (outermost
    first): a subclass of the same name, so ``type(comm).__name__`` and
    ``isinstance`` read as for ``cls``. ``()`` returns ``cls`` itself."""
    if not layers:
        return cls
    return type(cls.__name__, tuple(layers) + (cls,), {
        '__module__': cls.__module__, '__qualname__': cls.__qualname__,
        '__doc__': cls.__doc__, 'layers': tuple(layers)})
