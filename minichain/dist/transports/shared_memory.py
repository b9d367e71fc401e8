"""The shared-memory layer: on one machine, ranks sum the packed buffer in
memory they all map, instead of through MPI's Allreduce.

MPI's Allreduce between processes on one machine copies every byte into
its shared segment and out again, and the flat communicator has already
copied every gradient into its packed buffer: at tens of MB, those copies
cost more than the additions (``bench/allreduce.py``). When every rank is
on one machine, this layer packs straight into a file that all ranks map
(each rank its own region), and the sum is a reduce-scatter and an
allgather done by plain NumPy on the mapped regions: rank ``r`` adds up
slice ``r`` of every rank's region (in rank order, so the bits are the same
everywhere) and writes the sum into that slice of every region. Two
barriers bracket each piece: the first says every rank has packed it, the
second that every slice is summed. The packing copy is then the only copy.

The file never has a name. Rank 0 makes it unnamed (``O_TMPFILE``) in
``/dev/shm`` (memory-backed, within its size), and the others open it
through ``/proc/<rank 0's pid>/fd/<its descriptor>``: nothing is ever in
the folder to be left behind, however any rank ends (``kill -9`` at any
point included), and the kernel frees the memory when the last rank that
maps it exits. (A name unlinked once every rank has opened it, as
:mod:`minichain.dist.shm_files` does for MPICH's own file, is
left when a rank is killed before that: the launcher then SIGKILLs rank 0
too, before it can remove it.)

Only a communicator whose sum is MPI's Allreduce gets it (the flat one; the
ring keeps its ring), on host buffers (CuPy buffers go through their own
path) and when every rank is on this machine; otherwise, and if the file
cannot be made or opened on some rank (not Linux, a full ``/dev/shm``, a
``/proc`` that hides other processes), everything is as without the layer.
"""
import mmap
import os
import tempfile
import weakref

import numpy

from minichain import backend
from minichain.dist import mpi
from minichain.dist.transports import pipeline

# Each rank's region starts on a page of its own.
_ALIGN = mmap.PAGESIZE
# Where the machine does not say its cache sizes.
_DEFAULT_PIECE_BYTES = 512 << 10


def piece_bytes():
    """The pieces the shared buffer is packed and summed in: half a
    core's level-2 cache (as Linux reports it), so that a piece packed by
    this rank is still in its cache when the rank adds it up. One piece is
    also the least a buffer must hold to be summed here: a smaller one is
    a matter of latency, where MPI's one small message is faster than two
    barriers."""
    try:
        base = '/sys/devices/system/cpu/cpu0/cache'
        for index in sorted(os.listdir(base)):
            with open(os.path.join(base, index, 'level')) as f:
                if f.read().strip() != '2':
                    continue
            with open(os.path.join(base, index, 'size')) as f:
                text = f.read().strip().upper()
            scale = {'K': 1 << 10, 'M': 1 << 20}.get(text[-1:], 1)
            size = int(text.rstrip('KMB')) * scale
            return min(4 << 20, max(64 << 10, size // 2))
    except (OSError, ValueError):
        pass
    return _DEFAULT_PIECE_BYTES


class Regions:
    """A file mapped by every rank, cut into one region per rank of ``n``
    ``dtype`` elements; ``own`` is this rank's, ``all`` every rank's."""

    def __init__(self, mm, dtype, n, size, rank):
        self.mm, self.dtype, self.n = mm, numpy.dtype(dtype), n
        stride = _region_bytes(self.dtype, n)
        self.all = [numpy.frombuffer(mm, self.dtype, n, q * stride)
                    for q in range(size)]
        self.own = self.all[rank]
        self.start = self.own.__array_interface__['data'][0]
        self.tmp = None  # a piece's partial sums, with more than two ranks

    def offset_of(self, buf):
        """Where ``buf`` starts in ``own`` (in elements), or None when it
        is not a view into it."""
        if type(buf) is not numpy.ndarray or buf.dtype != self.dtype:
            return None
        lo, rem = divmod(buf.__array_interface__['data'][0] - self.start,
                         self.dtype.itemsize)
        if rem or lo < 0 or lo + buf.size > self.n:
            return None
        return lo


def _region_bytes(dtype, n):
    return -(-n * dtype.itemsize // _ALIGN) * _ALIGN


def _shm_dir():
    return '/dev/shm' if os.access('/dev/shm', os.W_OK) else \
        tempfile.gettempdir()


def map_regions(wire, dtype, n):
    """Collective over ``wire`` (an mpi4py communicator or a watched Wire,
    every rank on this machine): a new :class:`Regions`, or None on every
    rank if some rank could not map the file (why: the module's
    ``why_not``)."""
    rank, size = wire.rank, wire.size
    nbytes = _region_bytes(numpy.dtype(dtype), n) * size
    fd = error = None
    try:
        if rank == 0:
            try:
                # a file without a name in that folder (where there is no
                # O_TMPFILE, opening the folder itself fails: MPI's way)
                fd = os.open(_shm_dir(), getattr(os, 'O_TMPFILE', 0) |
                             os.O_RDWR, 0o600)
                # Reserve the memory now: a sparse file on a full tmpfs
                # (a container's small /dev/shm) would kill the ranks with
                # SIGBUS at the first write instead.
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as e:
                error = ('rank 0 could not make an unnamed {} MB file in '
                         '{}: {}'.format(nbytes >> 20, _shm_dir(), e))
        where, error = mpi.allgather_obj(wire, (
            '/proc/{}/fd/{}'.format(os.getpid(), fd), error))[0]
        mm = None
        if error is None:
            try:
                with open(where, 'r+b') as f:
                    mm = mmap.mmap(f.fileno(), nbytes)
            except OSError as e:
                error = 'rank {} could not map rank 0\'s file: {}'.format(
                    rank, e)
        errors = [e for e in mpi.allgather_obj(wire, error) if e]
    finally:
        if fd is not None:  # every rank has mapped it, or given up
            os.close(fd)
    if errors:
        if mm is not None:
            mm.close()
        global why_not
        why_not = errors[0]
        return None
    return Regions(mm, dtype, n, size, rank)


why_not = None  # why the last map_regions returned None


class SharedMemory:
    """Layer (see :func:`minichain.dist.communicator_base.with_layers`):
    the packed host buffer lives in memory every rank maps, and is summed
    there (see the module docstring)."""

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        self._regions = weakref.WeakKeyDictionary()  # model -> Regions
        self._mapped = False  # whether a model's regions were ever mapped
        # Every rank must cut the same pieces (a barrier each): rank 0's.
        self.piece_bytes = self.mpi_comm.bcast(piece_bytes(), root=0)

    def shares_memory(self):
        """Whether this communicator sums through the mapped file: more
        than one rank, all on this machine, and its sum is MPI's Allreduce
        (the layer takes that one's place only)."""
        from minichain.dist.flat import FlatCommunicator
        sums = getattr(super(SharedMemory, self), 'sum_on_host', None)
        return (1 < self.size == self.intra_size
                and getattr(sums, '__func__', None)
                is FlatCommunicator.sum_on_host)

    def packed_buffer(self, model, like, dtype, n):
        if (n * numpy.dtype(dtype).itemsize < self.piece_bytes
                or (like is not None and backend.get_device_id(like) >= 0)
                or not self.shares_memory()):
            return super().packed_buffer(model, like, dtype, n)
        regions = self._regions.get(model)
        if regions is None or regions.dtype != dtype or regions.n != n:
            regions = map_regions(self.wire, dtype, n)
            if regions is None:  # on every rank: MPI's way, as without us
                return super().packed_buffer(model, like, dtype, n)
            self._regions[model] = regions
            self._mapped = True
        return regions.own

    # pieces and sum_on_host look for buf among the mapped regions only
    # once some exist (a WeakKeyDictionary's len() alone costs more than
    # the rest of the check: a 4 KB averaging is mostly Python).
    def pieces(self, buf):
        for regions in self._regions.values() if self._mapped else ():
            if buf is regions.own:
                return pipeline.cut(buf, self.piece_bytes)
        return super().pieces(buf)

    def sum_on_host(self, buf):
        for regions in self._regions.values() if self._mapped else ():
            lo = regions.offset_of(buf)
            if lo is not None:
                return self._sum_in_place(regions, lo, lo + buf.size)
        return super().sum_on_host(buf)

    def _sum_in_place(self, regions, lo, hi):
        """Sum piece ``[lo, hi)`` of every rank's region, in place in all.

        Rank ``r`` adds up slice ``r`` of the piece over all regions and
        writes the sum into that slice of every region: no two ranks write
        the same bytes, and every region ends with the whole sum. (Writing
        only its own region and collecting the others' slices a piece later
        saves a barrier a piece, and measured no faster.)"""
        self.wire.Barrier()  # every rank has packed [lo, hi)
        a, b = _slice(lo, hi, self.rank, self.size)
        parts = [r[a:b] for r in regions.all]
        mine = parts[self.rank]
        if self.size == 2:  # in rank order; ``mine`` is one of the two
            numpy.add(parts[0], parts[1], out=mine)
        else:
            if regions.tmp is None or regions.tmp.size < b - a:
                regions.tmp = numpy.empty(b - a, regions.dtype)
            total = regions.tmp[:b - a]
            numpy.add(parts[0], parts[1], out=total)
            for part in parts[2:]:
                numpy.add(total, part, out=total)
            mine[...] = total
        for part in parts:
            if part is not mine:
                part[...] = mine
        self.wire.Barrier()  # every slice summed, in every region


def _slice(lo, hi, rank, size):
    """Rank ``rank``'s share of the piece ``[lo, hi)``."""
    return lo + (hi - lo) * rank // size, lo + (hi - lo) * (rank + 1) // size
