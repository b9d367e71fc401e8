"""The pipeline layer: a packed host buffer summed in pieces of a few MB.

A piece of a few MB is summed while it is still in the last-level cache
from its packing, which is faster than one Allreduce of the whole buffer
(large single messages are also slow in MPICH's shared-memory path;
``bench/allreduce.py`` compares the two). The flat communicator packs and
sums piece by piece already (:meth:`~minichain.dist.flat.FlatCommunicator.
pieces`); this layer only makes the pieces small.
"""
import numpy

from minichain.dist import mpi

PIPELINE_BYTES = 4 << 20


class Pipelined:
    """Layer (a class put in front of a communicator class, see
    :func:`minichain.dist.communicator_base.with_layers`): host buffers go
    in pieces of ``PIPELINE_BYTES``; GPU buffers stay whole (a piece there
    would cost a host round trip each)."""

    def pieces(self, buf):
        if 0 < buf.nbytes <= PIPELINE_BYTES:  # one piece, as without us
            return ((0, buf.size),)           # (4 KB averagings: Python)
        if not isinstance(buf, numpy.ndarray):  # CuPy's
            return super().pieces(buf)
        return cut(buf, min(PIPELINE_BYTES, mpi.CHUNK_BYTES))


def cut(buf, nbytes):
    """The ``(lo, hi)`` element ranges of the 1-d ``buf`` in pieces of
    ``nbytes`` (the last one shorter)."""
    step = max(1, nbytes // buf.itemsize)
    return [(lo, min(buf.size, lo + step)) for lo in range(0, buf.size, step)]
