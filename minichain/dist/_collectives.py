"""Array and object collectives shared by every communicator.

Arrays travel through host memory (CuPy arrays are staged and come back as
CuPy arrays on the current device). Every collective whose ranks must agree
on shapes first exchanges a small header, so that a shape mismatch raises the
same ValueError on every rank instead of truncating or hanging.
"""
import numpy

from minichain.dist import _mpi
from minichain.dist.safety import format_ranks

_OPS = ('sum', 'mean', 'max', 'min', 'prod')


def _meta(x, where):
    if not hasattr(x, 'shape') or not hasattr(x, 'dtype'):
        raise TypeError('{}: expected a NumPy or CuPy array, got {}'.format(
            where, type(x).__name__))
    return tuple(x.shape), numpy.dtype(x.dtype).str


def _same_meta(metas, where):
    if any(m != metas[0] for m in metas):
        raise ValueError('{}: the arrays differ between ranks: {}'.format(
            where, '; '.join('{}: shape {} dtype {}'.format(
                format_ranks([r]), m[0], numpy.dtype(m[1]).name)
                for r, m in enumerate(metas))))


class CollectivesMixin:
    """Array and object collectives over ``self.mpi_comm``."""

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
        MPI = self._check_allreduce(x, op)
        host, on_gpu = _mpi.to_host(x)
        if host.dtype.kind == 'b' or host.dtype == numpy.float16:
            wide = numpy.int64 if host.dtype.kind == 'b' else numpy.float32
            buf = host.astype(wide)
        else:
            buf = numpy.array(host, copy=True, order='C')
        mpi_op = {'sum': MPI.SUM, 'mean': MPI.SUM, 'max': MPI.MAX,
                  'min': MPI.MIN, 'prod': MPI.PROD}[op]
        _mpi.allreduce_buffer(self.mpi_comm, buf, mpi_op)
        if op == 'mean':
            buf = buf / self.size
        if buf.dtype != host.dtype and host.dtype.kind in 'fc':
            buf = buf.astype(host.dtype)
        return _mpi.from_host(buf, on_gpu)

    def _check_allreduce(self, x, op):
        """Validate ``op`` and that every rank passes the same shape and
        dtype (one small host allgather); returns the MPI module."""
        if op not in _OPS:
            raise ValueError('allreduce: op must be one of {}, got {!r}'
                             .format(', '.join(_OPS), op))
        MPI = _mpi.import_mpi()
        _same_meta(self.mpi_comm.allgather(_meta(x, 'allreduce')), 'allreduce')
        return MPI

    def bcast(self, x, root=0):
        """Return ``root``'s array on every rank (``x`` ignored elsewhere)."""
        meta = (_meta(x, 'bcast') + (_mpi.to_host(x)[1],)
                if self.rank == root else None)
        shape, dtype, on_gpu = self.mpi_comm.bcast(meta, root=root)
        if self.rank == root:
            buf = numpy.asarray(_mpi.to_host(x)[0], order='C')
        else:
            buf = numpy.empty(shape, dtype=dtype)
        _mpi.bcast_buffer(self.mpi_comm, _mpi.as_bytes(buf), root)
        return _mpi.from_host(buf, on_gpu) if self.rank != root else x

    def allgather(self, x):
        """Stack every rank's ``x`` (same shape and dtype) along a new axis 0.

        Returns:
            Array of shape ``(size,) + x.shape`` on every rank.
        """
        _same_meta(self.mpi_comm.allgather(_meta(x, 'allgather')),
                   'allgather')
        host, on_gpu = _mpi.to_host(x)
        src = _mpi.as_bytes(host)
        out = numpy.empty((self.size,) + host.shape, dtype=host.dtype)
        dst = out.reshape(self.size, -1).view(numpy.uint8)
        for start, stop in _mpi.chunks(src.size, self.size):
            if start == 0 and stop == src.size:
                self.mpi_comm.Allgather(src, dst)
            else:
                part = numpy.empty((self.size, stop - start), numpy.uint8)
                self.mpi_comm.Allgather(src[start:stop], part)
                dst[:, start:stop] = part
        return _mpi.from_host(out, on_gpu)

    def gather(self, x, root=0):
        """Stack every rank's ``x`` (same shape and dtype) on ``root``.

        Returns:
            Array of shape ``(size,) + x.shape`` on ``root``; None elsewhere.
        """
        return self._gather_rows(x, root)

    def scatter(self, xs, root=0):
        """Rank ``r`` gets ``xs[r]``; ``xs`` (shape ``(size, ...)``) is read
        on ``root`` only."""
        if self.rank == root:
            if len(xs) != self.size:
                meta = ('bad', len(xs))
            else:
                meta = (_meta(xs, 'scatter'), _mpi.to_host(xs)[1])
        else:
            meta = None
        meta = self.mpi_comm.bcast(meta, root=root)
        if meta[0] == 'bad':
            raise ValueError('scatter: root {} passed {} rows for {} ranks'
                             .format(root, meta[1], self.size))
        (shape, dtype), on_gpu = meta
        if self.rank == root:
            rows = numpy.asarray(_mpi.to_host(xs)[0], order='C')
            rows = rows.reshape(self.size, -1)
            for r in range(self.size):
                if r != root:
                    self._send_host(rows[r], r, tag=0x5CA7)
            return xs[root]
        out = numpy.empty(shape[1:], dtype=dtype)
        self._recv_host(out, root, tag=0x5CA7)
        return _mpi.from_host(out, on_gpu)

    def send(self, x, dest, tag=0):
        """Send array ``x`` to rank ``dest`` (shape and dtype travel too)."""
        host, on_gpu = _mpi.to_host(x)
        host = numpy.asarray(host, order='C')
        self.mpi_comm.send((host.shape, host.dtype.str, on_gpu), dest=dest,
                           tag=tag)
        self._send_host(host, dest, tag)

    def recv(self, source, tag=0):
        """Receive an array sent by :meth:`send` (CuPy if it was CuPy)."""
        shape, dtype, on_gpu = self.mpi_comm.recv(source=source, tag=tag)
        out = numpy.empty(shape, dtype=dtype)
        self._recv_host(out, source, tag)
        return _mpi.from_host(out, on_gpu)

    # -- objects --------------------------------------------------------------
    def bcast_obj(self, obj, root=0):
        """Return ``root``'s picklable object on every rank (any size)."""
        return _mpi.bcast_obj(self.mpi_comm, obj, root)

    def gather_obj(self, obj, root=0):
        """List of every rank's object on ``root``; None elsewhere."""
        if self.rank != root:
            _mpi.send_obj(self.mpi_comm, obj, root, tag=0x6A7)
            return None
        return [obj if r == root else
                _mpi.recv_obj(self.mpi_comm, r, tag=0x6A7)
                for r in range(self.size)]

    def allgather_obj(self, obj):
        """List of every rank's (small) object on every rank."""
        return self.mpi_comm.allgather(obj)

    def allreduce_obj(self, obj, op='sum'):
        """Reduce picklable objects with ``+`` (``'sum'``), ``max`` or ``min``
        in rank order; every rank gets the result."""
        fns = {'sum': lambda a, b: a + b, 'max': max, 'min': min}
        if op not in fns:
            raise ValueError('allreduce_obj: op must be one of sum, max, min, '
                             'got {!r}'.format(op))
        values = self.mpi_comm.allgather(obj)
        out = values[0]
        for v in values[1:]:
            out = fns[op](out, v)
        return out

    def send_obj(self, obj, dest, tag=0):
        """Send a picklable object (any size) to rank ``dest``."""
        _mpi.send_obj(self.mpi_comm, obj, dest, tag)

    def recv_obj(self, source, tag=0):
        """Receive an object sent by :meth:`send_obj`."""
        return _mpi.recv_obj(self.mpi_comm, source, tag)

    # -- helpers --------------------------------------------------------------
    def _gather_rows(self, x, root):
        metas = self.mpi_comm.allgather(_meta(x, 'gather'))
        _same_meta(metas, 'gather')
        host, on_gpu = _mpi.to_host(x)
        host = numpy.asarray(host, order='C')
        if self.rank != root:
            self._send_host(host, root, tag=0x6A8)
            return None
        out = numpy.empty((self.size,) + host.shape, dtype=host.dtype)
        rows = out.reshape(self.size, -1)
        for r in range(self.size):
            if r == root:
                rows[r] = host.reshape(-1)
            else:
                self._recv_host(rows[r], r, tag=0x6A8)
        return _mpi.from_host(out, on_gpu)

    def _send_host(self, a, dest, tag):
        flat = _mpi.as_bytes(a)
        for start, stop in _mpi.chunks(flat.size, 1):
            self.mpi_comm.Send(flat[start:stop], dest=dest, tag=tag)

    def _recv_host(self, out, source, tag):
        flat = out.reshape(-1).view(numpy.uint8)
        for start, stop in _mpi.chunks(flat.size, 1):
            self.mpi_comm.Recv(flat[start:stop], source=source, tag=tag)
