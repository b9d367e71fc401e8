"""The ring communicator: the allreduce written out by hand.

The flat communicator hands the packed gradient buffer to MPI's
``Allreduce`` and gets the sum back. Inside, MPI (and NCCL) run something
close to what this file does in plain Python: a **ring**. The ``N`` ranks
stand in a circle; each sends only to its right neighbour (``rank + 1``)
and receives only from its left one (``rank - 1``). The buffer is cut into
``N`` chunks (their sizes differ by at most one element) and the sum is
built in two phases of ``N - 1`` steps each:

1. **reduce-scatter**: at step ``s`` rank ``r`` sends chunk ``r - s`` to
   the right and receives chunk ``r - s - 1`` from the left, which it adds
   to its own copy of that chunk. A chunk travels once round the circle,
   picking up one rank's term at each stop: after ``N - 1`` steps rank
   ``r`` holds the full sum of chunk ``r + 1``.
2. **allgather**: at step ``s`` rank ``r`` sends the finished chunk
   ``r + 1 - s`` to the right and receives finished chunk ``r - s`` from
   the left, straight into place. After ``N - 1`` steps every rank holds
   every finished chunk.

(Chunk numbers are taken modulo ``N``.) Why a ring: in each of the
``2(N - 1)`` steps every rank sends one chunk, ``n / N`` bytes of an
``n``-byte buffer, and all links are busy at once, so each rank sends

.. math:: 2 (N - 1) \\cdot \\frac{n}{N} = \\frac{2(N-1)}{N}\\, n

bytes in all: less than ``2n`` whatever ``N`` is. The time per rank
hardly grows with the number of ranks (only the ``2(N - 1)`` latencies
do), which is why data parallelism scales to hundreds of GPUs.
docs/ring_and_zero.md works through ``N = 3`` by hand.

Rounding: the ring sums chunk ``c`` in the order ``g_c + g_{c+1} + ...``
(the values packed, already scaled by ``1 / N``), MPI in an order of its
own. Each of the two is within ``gamma_{N-1} * sum_i |g_i|`` of the exact
sum, elementwise, with ``gamma_k = k u / (1 - k u)`` and ``u`` the unit
roundoff (half the machine epsilon ``eps``) of the buffer dtype, so

.. math:: |\\mathrm{ring} - \\mathrm{flat}| \\le 2\\gamma_{N-1}
          \\sum_i |g_i| \\approx (N - 1)\\,\\mathrm{eps} \\sum_i |g_i|

elementwise (tests/dist/test_ring.py checks it at 2-5 ranks). Every rank
ends with the same bits (the allgather copies the one finished chunk).
float16 is summed in float16, each addition rounded, as MPICH sums it for
the flat communicator.

Everything else (parameter broadcast, the headers and agreement checks,
the model checks, join, the NaN check, staging CuPy gradients through the
host, the pipeline chunks) is the flat communicator's: only
``_sum_across_ranks`` differs. Every wait goes through the communicator's
:class:`~minichain.dist.watchdog.Wire`, so a rank that stops sending is
named by the stall watchdog, and each step is a ``reduce-scatter`` or
``allgather`` span on the timeline (inside flat's ``allreduce`` span).
"""
import numpy

from minichain.dist import _mpi, timeline
from minichain.dist.flat import FlatCommunicator


def chunk_bounds(n, size):
    """Where each of ``size`` chunks of an ``n``-element buffer starts,
    and the end: ``bounds[c]:bounds[c + 1]`` is chunk ``c``. Sizes differ
    by at most one element (some are empty when ``n < size``)."""
    return [c * n // size for c in range(size + 1)]


class RingCommunicator(FlatCommunicator):
    """Averages gradients like the flat communicator, but sums the packed
    buffer with a ring allreduce of its own (reduce-scatter, then
    allgather, over point-to-point messages) instead of MPI's
    ``Allreduce``; see the module docstring. Not with ``overlap``: the
    buckets of an overlapped averaging would go through MPI's own
    ``Iallreduce``, not this ring."""

    name = 'ring'
    can_overlap = False

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        self._inbox = numpy.empty(0)  # where reduce-scatter receives

    def _sum_across_ranks(self, buf):
        """Replace the 1-d host array ``buf`` by its sum over all ranks, in
        place, around the ring."""
        size, rank = self.size, self.rank
        bounds = chunk_bounds(buf.size, size)

        def chunk(c):
            c %= size
            return buf[bounds[c]:bounds[c + 1]]

        inbox = self._inbox_for(buf.dtype, bounds)
        # Phase 1, reduce-scatter (N - 1 steps): chunk r - s goes right,
        # chunk r - s - 1 comes from the left and is added to ours.
        for s in range(size - 1):
            out, mine = chunk(rank - s), chunk(rank - s - 1)
            theirs = inbox[:mine.size]
            with timeline.span('reduce-scatter', out.nbytes):
                self._exchange(out, theirs)
                numpy.add(mine, theirs, out=mine)
        # Now chunk rank + 1 holds the sum of every rank's terms.
        # Phase 2, allgather (N - 1 steps): finished chunk r + 1 - s goes
        # right, finished chunk r - s comes from the left, into place.
        for s in range(size - 1):
            out, into = chunk(rank + 1 - s), chunk(rank - s)
            with timeline.span('allgather', out.nbytes):
                self._exchange(out, into)

    def _exchange(self, send, recv):
        """One step: send ``send`` to the right neighbour while receiving
        ``recv`` from the left one.

        Both are posted before either is waited for: a blocking send first
        would wait for the right neighbour, which sends first too, all
        round the circle. They travel as bytes (an MPI without a float16
        type moves them too), in pieces below ``_mpi.CHUNK_BYTES``; the
        two ends cut a chunk alike, since both know its size. The waits
        are the Wire's: the stall watchdog names a rank that stops
        sending.
        """
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        requests = []
        for start, stop in _mpi.chunks(recv.nbytes, 1):
            requests.append(self._wire.Irecv(_mpi.as_bytes(recv)[start:stop],
                                             left, _mpi.TAG_RING))
        for start, stop in _mpi.chunks(send.nbytes, 1):
            requests.append(self._wire.Isend(_mpi.as_bytes(send)[start:stop],
                                             right, _mpi.TAG_RING))
        for request in requests:
            self._wire.wait(request)

    def _inbox_for(self, dtype, bounds):
        """A scratch buffer for the largest chunk, reused across calls."""
        n = max(b - a for a, b in zip(bounds, bounds[1:]))
        if self._inbox.dtype != dtype or self._inbox.size < n:
            self._inbox = numpy.empty(n, dtype)
        return self._inbox
