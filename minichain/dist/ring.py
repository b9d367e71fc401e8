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
``sum_on_host`` differs, and with ``overlap`` the buckets go round
the ring too (:class:`RingBuckets`). The two phases are written once, in
:func:`ring_steps`, a generator that yields after posting each step: the
blocking sum waits for each step at once, an overlapped bucket whenever
the gradient hooks look. Every wait goes through the communicator's
:class:`~minichain.dist.guards.watchdog.Wire` (with the guards, as by
default), so a rank that stops sending is
named by the stall watchdog, and each step is a ``reduce-scatter`` or
``allgather`` span on the timeline (inside flat's ``allreduce`` span).
"""
import numpy

from minichain.dist import hooks, mpi
from minichain.dist.mpi_buckets import MpiBuckets
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
    ``Allreduce``; see the module docstring. With ``overlap``, each bucket
    goes round the ring too (:class:`RingBuckets`)."""

    name = 'ring'

    def __init__(self, mpi_comm=None, allreduce_grad_dtype=None):
        super().__init__(mpi_comm, allreduce_grad_dtype)
        self._inbox = numpy.empty(0)  # where reduce-scatter receives

    def sum_on_host(self, buf):
        """Sum the host array ``buf`` over the ranks in place, around the
        ring: each step waits for its messages before the next one begins
        (flat's allreduce_packed stages CuPy buffers through the host)."""
        self._inbox = grown(self._inbox, buf.dtype, buf.size, self.size)
        self._walk(ring_steps(self.wire, buf, self._inbox))

    # A sharded optimizer state uses the two phases apart, shifted so that
    # rank r finishes chunk r (the owner layout of shard_bounds).
    def _reduce_scatter_host(self, host):
        self._inbox = grown(self._inbox, host.dtype, host.size, self.size)
        self._walk(reduce_scatter_steps(self.wire, host, self._inbox, -1))

    def _allgather_host(self, host):
        self._walk(allgather_steps(self.wire, host, -1))

    def _walk(self, steps):
        for requests in steps:
            for request in requests:
                self.wait_request(request)

    def bucket_transport(self, device):
        return RingBuckets(self.bucket_wire(), device,
                           self.allreduce_grad_dtype)


def ring_steps(wire, buf, inbox):
    """The ring allreduce of the 1-d host array ``buf`` over the ranks of
    ``wire`` (a :class:`~minichain.dist.guards.watchdog.Wire`), step by step.

    A generator: each step posts its send and its receive and yields their
    requests; resumed once they have completed, it adds what it received
    (reduce-scatter) and posts the next step. ``inbox`` holds at least the
    largest chunk: where the reduce-scatter receives.
    """
    yield from reduce_scatter_steps(wire, buf, inbox)
    # Now chunk rank + 1 holds the sum of every rank's terms.
    yield from allgather_steps(wire, buf)


def _chunks(wire, buf, shift):
    """``chunk(c)``: chunk ``c + shift`` (modulo the ranks) of ``buf``."""
    bounds = chunk_bounds(buf.size, wire.size)

    def chunk(c):
        c = (c + shift) % wire.size
        return buf[bounds[c]:bounds[c + 1]]
    return chunk


def reduce_scatter_steps(wire, buf, inbox, shift=0):
    """Phase 1, reduce-scatter (``N - 1`` steps, as :func:`ring_steps`):
    chunk ``r - s`` goes right, chunk ``r - s - 1`` comes from the left and
    is added to ours. Rank ``r`` ends with the sum of chunk ``r + 1 +
    shift`` (``shift=-1``: of its own chunk ``r``, the owner layout of a
    sharded optimizer state)."""
    chunk = _chunks(wire, buf, shift)
    for s in range(wire.size - 1):
        out, mine = chunk(wire.rank - s), chunk(wire.rank - s - 1)
        theirs = inbox[:mine.size]
        with hooks.span('reduce-scatter', out.nbytes):
            yield exchange(wire, out, theirs)
            numpy.add(mine, theirs, out=mine)


def allgather_steps(wire, buf, shift=0):
    """Phase 2, allgather (``N - 1`` steps): finished chunk ``r + 1 - s``
    goes right, finished chunk ``r - s`` comes from the left, into place
    (chunk numbers plus ``shift``, as in :func:`reduce_scatter_steps`)."""
    chunk = _chunks(wire, buf, shift)
    for s in range(wire.size - 1):
        out, into = chunk(wire.rank + 1 - s), chunk(wire.rank - s)
        with hooks.span('allgather', out.nbytes):
            yield exchange(wire, out, into)


def exchange(wire, send, recv):
    """Post one step: ``send`` to the right neighbour and ``recv`` from the
    left one; returns the requests.

    Both are posted before either is waited for: a blocking send first
    would wait for the right neighbour, which sends first too, all round
    the circle. They travel as bytes (an MPI without a float16 type moves
    them too), in pieces below ``mpi.CHUNK_BYTES``; the two ends cut a
    chunk alike, since both know its size. The caller waits through the
    Wire, so that the stall watchdog names a rank that stops sending.
    """
    right, left = (wire.rank + 1) % wire.size, (wire.rank - 1) % wire.size
    return ([wire.Irecv(mpi.as_bytes(recv)[lo:hi], left, mpi.TAG_RING)
             for lo, hi in mpi.chunks(recv.nbytes, 1)] +
            [wire.Isend(mpi.as_bytes(send)[lo:hi], right, mpi.TAG_RING)
             for lo, hi in mpi.chunks(send.nbytes, 1)])


def grown(inbox, dtype, n, size):
    """``inbox``, or a new one when it is too small for the largest chunk
    of an ``n``-element buffer over ``size`` ranks (reused across calls)."""
    largest = -(-n // size)
    if inbox.dtype != dtype or inbox.size < largest:
        inbox = numpy.empty(largest, dtype)
    return inbox


class RingBuckets(MpiBuckets):
    """The buckets of an overlapped averaging, each summed around the ring.

    A bucket is packed as over MPI; its ring advances whenever the overlap
    tests it (from the gradient hooks, while backward runs) and finishes
    when it waits for it (after backward). The rings go one after the
    other in launch order (the overlap only ever tests its oldest bucket
    in flight, and waits for them in order), so the messages between two
    neighbours come in the order their receives were posted, under one
    tag.
    """

    def __init__(self, wire, device, grad_dtype=None):
        super().__init__(wire, device, grad_dtype)
        self._inbox = numpy.empty(0)

    def start(self, bucket, scale):
        # the ring begins at the bucket's first test, once the one before
        # it has finished
        bucket.work = _RingWork(self.pack(bucket, scale))

    def test(self, bucket):
        return self._advance(bucket.work, wait=False)

    def complete(self, bucket):
        self._advance(bucket.work, wait=True)
        self.unstage(bucket, bucket.work.host)
        bucket.work = None

    def _advance(self, work, wait):
        """Go round the ring as far as the messages allow (``wait``: to
        the end); whether the ring has finished."""
        if work.steps is None:
            self._inbox = grown(self._inbox, work.host.dtype, work.host.size,
                                self.wire.size)
            work.steps = ring_steps(self.wire, work.host, self._inbox)
        while not work.done:
            if wait:
                for request in work.requests:
                    self.wire.wait(request)
            elif not self.wire.test(work.requests):
                return False
            work.requests = next(work.steps, None)
            work.done = work.requests is None
        return True


class _RingWork:
    """A bucket's ring in flight: its host buffer, its steps (a
    :func:`ring_steps` generator, made at the first test), the requests of
    the current step."""

    def __init__(self, host):
        self.host, self.steps, self.requests, self.done = host, None, [], False
