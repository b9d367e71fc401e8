"""Array and object collectives shared by every communicator.

Arrays travel through host memory (CuPy arrays are staged and come back as
CuPy arrays on the current device). Every collective opens with the header
of :func:`minichain.dist.guards.agreement.header`, which also carries what its ranks
must agree on (shapes, dtypes, the root) and the lengths the receivers need,
so that a mismatch, or a bad argument on one rank, raises the same error on
every rank instead of truncating or hanging. All messages go through the
communicator's :class:`~minichain.dist.guards.watchdog.Wire`.
"""
import functools
import pickle

import numpy

from minichain.dist import mpi
from minichain.dist import failures
from minichain.dist.failures import attempt

_OPS = ('sum', 'mean', 'max', 'min', 'prod')


def _meta(x, where):
    if not hasattr(x, 'shape') or not hasattr(x, 'dtype'):
        raise TypeError('{}: expected a NumPy or CuPy array, got {}'.format(
            where, type(x).__name__))
    return tuple(x.shape), numpy.dtype(x.dtype).str


def _host(x, where):
    """A C-ordered host copy (or view) of the NumPy or CuPy array ``x``."""
    _meta(x, where)
    return numpy.asarray(mpi.to_host(x)[0], order='C')


def _meta_error(where, names=()):
    """on_mismatch for ``(shape, dtype, *named values)`` headers."""
    def show(m):
        return 'shape {} dtype {}'.format(m[0], numpy.dtype(m[1]).name) + \
            ''.join(' {} {!r}'.format(k, v) for k, v in zip(names, m[2:]))

    def error(metas):
        return ValueError('{}: the arrays differ between ranks: {}'.format(
            where, failures.by_rank(metas, show)))
    return error


def _allreduce_meta(x, op):
    if op not in _OPS:
        raise ValueError('allreduce: op must be one of {}, got {!r}'.format(
            ', '.join(_OPS), op))
    return _meta(x, 'allreduce') + (op,)


class CollectivesMixin:
    """Array and object collectives over ``self.wire``, each in
    ``self.collective(kind)`` and opening with ``self.header(...)`` (see
    :class:`~minichain.dist.communicator_base.CommunicatorBase`)."""

    def _bcast_pickled(self, obj, root, agree=None):
        """Header (agreeing on ``agree``, the root and the length), then
        ``root``'s pickled ``obj`` on every rank; a Failure is raised on
        every rank."""
        data = mpi.pickled(obj) if self.rank == root else None
        _, (n,) = self.header((agree, root), root=root, root_values=(
            data.size if data is not None else 0,))
        buf = data.copy() if data is not None else numpy.empty(n, numpy.uint8)
        mpi.bcast_buffer(self.wire, buf, root)
        value = obj if self.rank == root else pickle.loads(buf.tobytes())
        failures.raise_failures([value])
        return value

    # -- arrays ---------------------------------------------------------------
    def allreduce(self, x, op='sum'):
        """Elementwise reduction of ``x`` over all ranks; every rank gets it.

        Args:
            x: NumPy or CuPy array, same shape and dtype on every rank.
            op: ``'sum'``, ``'mean'``, ``'max'``, ``'min'`` or ``'prod'``.
        Returns:
            A new array of x's dtype (``'mean'`` of integers is float64;
            a boolean sum counts, in int64).
        """
        with self.collective('allreduce'):
            MPI = self._agree_allreduce(x, op)
            host, on_gpu = mpi.to_host(x)
            if host.dtype.kind == 'b' or host.dtype == numpy.float16:
                wide = numpy.int64 if host.dtype.kind == 'b' else numpy.float32
                buf = host.astype(wide)
            else:
                buf = numpy.array(host, copy=True, order='C')
            mpi_op = {'sum': MPI.SUM, 'mean': MPI.SUM, 'max': MPI.MAX,
                      'min': MPI.MIN, 'prod': MPI.PROD}[op]
            mpi.allreduce_buffer(self.wire, buf, mpi_op)
        if op == 'mean':
            buf = buf / self.size
        if buf.dtype != host.dtype and host.dtype.kind in 'fc':
            buf = buf.astype(host.dtype)
        return mpi.from_host(buf, on_gpu)

    def check_allreduce(self, x, op):
        """The header of an allreduce as a collective of its own (for a
        communicator that reduces on the device); returns the MPI module."""
        with self.collective('allreduce'):
            return self._agree_allreduce(x, op)

    def _agree_allreduce(self, x, op):
        self.header(attempt(_allreduce_meta, x, op),
                     _meta_error('allreduce', ('op',)))
        return mpi.import_mpi()

    def bcast(self, x, root=0):
        """Return ``root``'s array on every rank (``x`` ignored elsewhere)."""
        with self.collective('bcast'):
            meta = (attempt(lambda: _meta(x, 'bcast') + (mpi.on_gpu(x),))
                    if self.rank == root else None)
            shape, dtype, on_gpu = self._bcast_pickled(meta, root)
            if self.rank == root:
                buf = numpy.asarray(mpi.to_host(x)[0], order='C')
            else:
                buf = numpy.empty(shape, dtype=dtype)
            mpi.bcast_buffer(self.wire, mpi.as_bytes(buf), root)
        return mpi.from_host(buf, on_gpu) if self.rank != root else x

    def allgather(self, x):
        """Stack every rank's ``x`` (same shape and dtype) along a new axis 0.

        Returns:
            Array of shape ``(size,) + x.shape`` on every rank.
        """
        with self.collective('allgather'):
            self.header(attempt(_meta, x, 'allgather'),
                         _meta_error('allgather'))
            host, on_gpu = mpi.to_host(x)
            src = mpi.as_bytes(host)
            out = numpy.empty((self.size,) + host.shape, dtype=host.dtype)
            dst = out.reshape(self.size, -1).view(numpy.uint8)
            for start, stop in mpi.chunks(src.size, self.size):
                if start == 0 and stop == src.size:
                    self.wire.Allgather(src, dst)
                else:
                    part = numpy.empty((self.size, stop - start), numpy.uint8)
                    self.wire.Allgather(src[start:stop], part)
                    dst[:, start:stop] = part
        return mpi.from_host(out, on_gpu)

    def gather(self, x, root=0):
        """Stack every rank's ``x`` (same shape and dtype) on ``root``.

        Returns:
            Array of shape ``(size,) + x.shape`` on ``root``; None elsewhere.
        """
        with self.collective('gather'):
            self.header(attempt(lambda: _meta(x, 'gather') + (root,)),
                         _meta_error('gather', ('root',)))
            host, on_gpu = mpi.to_host(x)
            host = numpy.asarray(host, order='C')
            if self.rank != root:
                self._send_host(host, root, mpi.TAG_GATHER)
                return None
            out = numpy.empty((self.size,) + host.shape, dtype=host.dtype)
            rows = out.reshape(self.size, -1)
            for r in range(self.size):
                if r == root:
                    rows[r] = host.reshape(-1)
                else:
                    self._recv_host(rows[r], r, mpi.TAG_GATHER)
        return mpi.from_host(out, on_gpu)

    def scatter(self, xs, root=0):
        """Rank ``r`` gets ``xs[r]``. ``xs``, read on ``root`` only, is an
        array of shape ``(size, ...)`` or a tuple or list of ``size``
        arrays (of any shapes and dtypes)."""
        def root_meta():
            if xs is None or len(xs) != self.size:
                raise ValueError('scatter: root {} passed {} rows for {} '
                                 'ranks'.format(root, None if xs is None
                                                else len(xs), self.size))
            return [_meta(x, 'scatter') for x in xs], mpi.on_gpu(xs[0])
        with self.collective('scatter'):
            meta = attempt(root_meta) if self.rank == root else None
            metas, on_gpu = self._bcast_pickled(meta, root)
            if self.rank == root:
                for r in range(self.size):
                    if r != root:
                        self._send_host(_host(xs[r], 'scatter'), r,
                                        mpi.TAG_SCATTER)
                return xs[root]
            out = numpy.empty(*metas[self.rank])
            self._recv_host(out, root, mpi.TAG_SCATTER)
        return mpi.from_host(out, on_gpu)

    def alltoall(self, xs):
        """Rank ``r`` sends ``xs[s]`` to rank ``s``, for every ``s``.

        Args:
            xs: a tuple or list of ``size`` arrays (any shapes and dtypes).
        Returns:
            A tuple of ``size`` arrays: entry ``s`` is what rank ``s`` sent
            to this rank (CuPy arrays when ``xs[0]`` is one).
        """
        def check():  # None, or the error every rank raises
            if len(xs) != self.size:
                raise ValueError('alltoall: rank {} passed {} arrays for {} '
                                 'ranks'.format(self.rank, len(xs), self.size))
            for x in xs:
                _meta(x, 'alltoall')
        with self.collective('alltoall'):
            self.header(attempt(check))
            theirs = mpi.allgather_obj(self.wire, [_meta(x, 'alltoall')
                                                   for x in xs])
            sent = [_host(x, 'alltoall') for x in xs]
            got = [sent[r] if r == self.rank else
                   numpy.empty(*theirs[r][self.rank]) for r in range(self.size)]
            # Every message posted at once, then waited for: no order of
            # sends and receives can leave two ranks waiting for each other.
            requests = []
            for r in range(self.size):
                if r != self.rank:
                    requests += self._post_host(sent[r], got[r], r)
            for request in requests:
                self.wait_request(request)
        on_gpu = mpi.on_gpu(xs[0])
        return tuple(mpi.from_host(y, on_gpu) for y in got)

    # -- point to point -------------------------------------------------------
    def send(self, data, dest, tag=0):
        """Send an array, or a tuple or list of arrays, to rank ``dest``;
        their shapes and dtypes travel first. Returns once the data has
        left (it may wait for ``dest`` to receive: big messages are not
        buffered)."""
        arrays = data if isinstance(data, (tuple, list)) else (data,)
        hosts = [_host(x, 'send') for x in arrays]
        meta = (arrays is data, [(a.shape, a.dtype.str) for a in hosts],
                any(mpi.on_gpu(x) for x in arrays))
        mpi.send_obj(self.wire, meta, self._peer(dest, 'send'), tag)
        for host in hosts:
            self._send_host(host, dest, tag)

    def recv(self, source, tag=0):
        """Receive what :meth:`send` sent from rank ``source``: an array, or
        a tuple of arrays if a tuple or list was sent (CuPy arrays, on the
        current device, if they were CuPy)."""
        is_tuple, metas, on_gpu = mpi.recv_obj(
            self.wire, self._peer(source, 'recv'), tag)
        got = [numpy.empty(shape, dtype) for shape, dtype in metas]
        for out in got:
            self._recv_host(out, source, tag)
        got = tuple(mpi.from_host(y, on_gpu) for y in got)
        return got if is_tuple else got[0]

    def send_obj(self, obj, dest, tag=0):
        """Send a picklable object (any size) to rank ``dest``."""
        mpi.send_obj(self.wire, obj, self._peer(dest, 'send_obj'), tag)

    def recv_obj(self, source, status=None, tag=None):
        """Receive an object sent by :meth:`send_obj` from rank ``source``
        (``MPI.ANY_SOURCE``: any rank) with tag ``tag`` (None: any tag, as
        ``MPI.ANY_TAG``). ``status``, an ``MPI.Status``, is filled with the
        message's source and tag."""
        MPI = mpi.import_mpi()
        if source != MPI.ANY_SOURCE:
            self._peer(source, 'recv_obj')
        return mpi.recv_obj(self.wire, source, MPI.ANY_TAG if tag is None
                            else tag, status)

    # -- objects --------------------------------------------------------------
    def bcast_obj(self, obj, root=0, *, max_buf_len=None):
        """Return ``root``'s picklable object on every rank (any size: it
        travels in chunks, so ChainerMN's ``max_buf_len`` is not needed)."""
        with self.collective('bcast_obj'):
            return self._bcast_pickled(obj, root)

    def gather_obj(self, obj, root=0):
        """List of every rank's object on ``root``; None elsewhere."""
        with self.collective('gather_obj'):
            self.header(root)
            if self.rank != root:
                mpi.send_obj(self.wire, obj, root, mpi.TAG_GATHER_OBJ)
                return None
            return [obj if r == root else
                    mpi.recv_obj(self.wire, r, mpi.TAG_GATHER_OBJ)
                    for r in range(self.size)]

    def allgather_obj(self, obj):
        """List of every rank's (small) object on every rank."""
        with self.collective('allgather_obj'):
            self.header()
            return mpi.allgather_obj(self.wire, obj)

    def allreduce_obj(self, obj, op='sum'):
        """Reduce picklable objects with ``+`` (``'sum'``), ``max`` or ``min``
        in rank order; every rank gets the result."""
        fns = {'sum': lambda a, b: a + b, 'max': max, 'min': min}

        def check():
            if op not in fns:
                raise ValueError('allreduce_obj: op must be one of sum, max, '
                                 'min, got {!r}'.format(op))
            return op
        with self.collective('allreduce_obj'):
            self.header(attempt(check))
            values = mpi.allgather_obj(self.wire, obj)
        return functools.reduce(fns[op], values)

    # -- helpers --------------------------------------------------------------
    def _send_host(self, a, dest, tag):
        flat = mpi.as_bytes(a)
        for start, stop in mpi.chunks(flat.size, 1):
            self.wire.Send(flat[start:stop], dest=dest, tag=tag)

    def _recv_host(self, out, source, tag):
        flat = out.reshape(-1).view(numpy.uint8)
        for start, stop in mpi.chunks(flat.size, 1):
            self.wire.Recv(flat[start:stop], source=source, tag=tag)

    def _post_host(self, a, out, peer):
        """Post the sends of host array ``a`` to ``peer`` and the receives
        of ``out`` from it (chunked); return the requests."""
        src, dst = mpi.as_bytes(a), out.reshape(-1).view(numpy.uint8)
        return ([self.wire.Isend(src[lo:hi], peer, mpi.TAG_ALLTOALL)
                 for lo, hi in mpi.chunks(src.size, 1)] +
                [self.wire.Irecv(dst[lo:hi], peer, mpi.TAG_ALLTOALL)
                 for lo, hi in mpi.chunks(dst.size, 1)])

    def _peer(self, rank, where):
        """``rank``, or a ValueError unless it is another rank: a message
        to oneself, or to no one, would wait forever."""
        if not (isinstance(rank, (int, numpy.integer)) and 0 <= rank <
                self.size and rank != self.rank):
            raise ValueError('{}: rank {} cannot exchange messages with rank '
                             '{!r} (the communicator has ranks 0-{})'.format(
                                 where, self.rank, rank, self.size - 1))
        return int(rank)
