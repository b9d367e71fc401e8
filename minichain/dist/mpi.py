"""MPI plumbing shared by the communicators.

The lazy mpi4py import (so that ``from minichain import dist`` works without
MPI), and byte messages of any size: MPI counts are C ints, so a message of
2 GiB or more is sent as a sequence of chunks below that limit. The helpers
use mpi4py's buffer methods only (``Bcast``, ``Allreduce``, ``Send``,
``Recv``), which a :class:`~minichain.dist.guards.watchdog.Wire` mirrors.
"""
import os
import pickle
import sys

import numpy

from minichain import backend

INSTALL_HINT = ('minichain.dist needs mpi4py and an MPI library: '
                'pip install mpi4py mpich   (or, in a minichain checkout: '
                'pip install -e ".[mpi]")')

# Every single MPI message stays below this many bytes (and elements).
# Tests lower it to exercise the chunked paths on small data.
CHUNK_BYTES = 1 << 30

# The tags of minichain's own point-to-point messages. A receive takes the
# first message from its source that carries its tag on its communicator, so
# two kinds of message that can travel between the same two ranks at the
# same time need different tags, or one is read as the other. A Wire carries
# the rows of gather and scatter, the objects of gather_obj and the shards of
# scatter_index and scatter_dataset, and also the user's own send and recv
# (tag 0 unless given); the timeline's events travel over the user's MPI
# communicator itself. Hence one tag per kind, none of them 0.
TAG_GATHER = 0x6A8            # gather: each rank's row, to the root
TAG_GATHER_OBJ = 0x6A7        # gather_obj: each rank's object, to the root
TAG_SCATTER = 0x5CA7          # scatter: the root's rows, to each rank
TAG_ALLTOALL = 0xA2A          # alltoall: one rank's array, to another
TAG_SCATTER_INDEX = 0x1D      # scatter_index: each rank's indices
TAG_SCATTER_DATASET = 0x1E    # scatter_dataset: each rank's examples
TAG_SNAPSHOT = 0x5A9          # replica sets: the loaded snapshot, to each
TAG_TIMELINE = 0x71E          # timeline: each rank's events, to rank 0
TAG_RING = 0x121              # ring: a chunk, to the next rank
# On communicators of their own (a Wire's side duplicate, the pytest
# plugin's duplicate of COMM_WORLD), apart from everything above:
TAG_NOTE = 7                  # watchdog: what a waiting rank waits for
TAG_TEST_RECORD = 1           # pytest plugin: a rank's outcome, to rank 0
TAG_TEST_ACK = 2              # pytest plugin: rank 0's combined outcome


def import_mpi():
    """Return ``mpi4py.MPI``, or raise ImportError saying how to install it.

    In a child of ``multiprocessing`` that is re-running the main module
    (a MultiprocessIterator's worker or forkserver, started with 'spawn' or
    'forkserver', in a script without ``if __name__ == '__main__':``), it
    ends that child with one line saying so: importing mpi4py there would
    start MPI with the rank's launcher settings, which fails with MPICH's
    ``PMI_Init returned -1`` and takes the worker down without a hint.
    """
    if _mpi:  # once loaded (every collective asks)
        return _mpi[0]
    _refuse_in_a_child_reimporting_main()
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError('{} ({})'.format(INSTALL_HINT, e)) from e
    except (RuntimeError, OSError) as e:  # mpi4py present, libmpi missing
        raise ImportError('{} (mpi4py is installed but could not load an MPI '
                          'library: {})'.format(INSTALL_HINT, e)) from e
    _mpi.append(MPI)
    return MPI


_mpi = []


def _refuse_in_a_child_reimporting_main():
    # multiprocessing's spawn and forkserver run the parent's main script
    # under the name '__mp_main__' in the child (the parent's own
    # sys.modules['__mp_main__'] is its '__main__').
    main = sys.modules.get('__mp_main__')
    if getattr(main, '__name__', None) != '__mp_main__':
        return
    # One line and SystemExit, not an exception: a traceback from inside the
    # child's bootstrap would hide the line that matters, and a forkserver's
    # child leaves through os._exit without printing SystemExit's message.
    sys.stderr.write(
        'minichain.dist: error: MPI started again in a multiprocessing child '
        '(pid {}) that is re-running the main module {}: put the script\'s '
        "code under if __name__ == '__main__': (MultiprocessIterator's "
        'workers import the main module)\n'.format(
            os.getpid(), getattr(main, '__file__', '?')))
    sys.stderr.flush()
    raise SystemExit(1)


def chunks(n_items, itemsize):
    """Yield ``(start, stop)`` ranges of at most CHUNK_BYTES bytes each."""
    step = max(1, CHUNK_BYTES // max(1, itemsize))
    if n_items == 0:
        return
    for start in range(0, n_items, step):
        yield start, min(n_items, start + step)


def as_bytes(a):
    """A flat uint8 view of a C-contiguous host array."""
    return numpy.ascontiguousarray(a).reshape(-1).view(numpy.uint8)


def bcast_buffer(comm, buf, root=0):
    """Broadcast the host array ``buf`` in place, chunked below 2 GiB."""
    flat = buf.reshape(-1)
    for start, stop in chunks(flat.size, flat.itemsize):
        comm.Bcast(flat[start:stop], root=root)


def allreduce_buffer(comm, buf, op):
    """In-place Allreduce of the host array ``buf`` with MPI op ``op``."""
    MPI = import_mpi()
    flat = buf.reshape(-1)
    for start, stop in chunks(flat.size, flat.itemsize):
        comm.Allreduce(MPI.IN_PLACE, flat[start:stop], op=op)


def iallreduce_buffer(wire, buf):
    """Post the in-place sum of the host array ``buf`` on ``wire`` (a
    :class:`~minichain.dist.guards.watchdog.Wire`) as non-blocking Allreduces,
    chunked below 2 GiB; returns their requests."""
    MPI = import_mpi()
    flat = buf.reshape(-1)
    return [wire.Iallreduce(MPI.IN_PLACE, flat[start:stop], op=MPI.SUM)
            for start, stop in chunks(flat.size, flat.itemsize)]


def pickled(obj):
    """``obj`` pickled, as a uint8 array (a message's buffer)."""
    return numpy.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL),
                            numpy.uint8)


def allgather_obj(comm, obj):
    """Every rank's picklable ``obj``, in rank order, over an mpi4py
    communicator or a :class:`~minichain.dist.guards.watchdog.Wire` (two
    messages: the lengths, then the bytes)."""
    data = pickled(obj)
    sizes = numpy.empty(comm.size, numpy.int64)
    comm.Allgather(numpy.array([data.size], numpy.int64), sizes)
    out = numpy.empty(int(sizes.sum()), numpy.uint8)
    offsets = numpy.concatenate([[0], numpy.cumsum(sizes)[:-1]])
    comm.Allgatherv(data, [out, sizes, offsets, import_mpi().BYTE])
    return [pickle.loads(out[o:o + n].tobytes())
            for o, n in zip(offsets, sizes)]


def send_obj(comm, obj, dest, tag=0):
    """Send a picklable object of any pickled size to ``dest`` (its length
    first, then its bytes in chunks).

    ``comm`` is an mpi4py communicator or a :class:`~minichain.dist.guards.watchdog.
    Wire` (only ``Send``/``Recv`` are used, so that a Wire can watch them)."""
    buf = pickled(obj)
    comm.Send(numpy.array([buf.size], numpy.int64), dest=dest, tag=tag)
    for start, stop in chunks(buf.size, 1):
        comm.Send(buf[start:stop], dest=dest, tag=tag)


def recv_obj(comm, source, tag=0, status=None):
    """Receive what :func:`send_obj` sent. ``source`` and ``tag`` may be
    ``MPI.ANY_SOURCE`` and ``MPI.ANY_TAG``: the chunks then come from where
    the length came from. ``status`` (an ``MPI.Status``) is filled in."""
    n = numpy.empty(1, numpy.int64)
    status = import_mpi().Status() if status is None else status
    comm.Recv(n, source=source, tag=tag, status=status)
    source, tag = status.Get_source(), status.Get_tag()
    buf = numpy.empty(int(n[0]), dtype=numpy.uint8)
    for start, stop in chunks(buf.size, 1):
        comm.Recv(buf[start:stop], source=source, tag=tag)
    return pickle.loads(buf.tobytes())


def on_gpu(x):
    """Whether ``x`` is a CuPy array (no copy)."""
    return backend.get_device_id(x) >= 0


def to_host(x):
    """``(host_array, was_on_gpu)`` for a NumPy or CuPy array."""
    gpu = on_gpu(x)
    return (backend.to_cpu(x) if gpu else numpy.asarray(x)), gpu


def from_host(a, on_gpu):
    """Move a host array back to the current GPU when ``on_gpu``."""
    return backend.to_gpu(a) if on_gpu else a
