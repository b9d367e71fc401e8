"""The wire: what a communicator's messages go through.

Here, straight to MPI: a :class:`Wire` is the communicator's own duplicate
of the MPI communicator (so that minichain's messages never meet the
user's), with mpi4py's methods (``Allreduce``, ``Bcast``, ``Send``,
``Recv``, ``Iallreduce``...) and the few the protocol adds: ``wait`` and
``test`` for requests, ``collective(kind)`` around one collective (nothing
here), ``allgather_obj``. The guards layer puts a watched wire in its place
(guards/watchdog.py): the same methods, but no wait is endless.
"""
import time

from minichain.dist import mpi


class Wire:
    """MPI calls, as they are, over a duplicate of ``mpi_comm``
    (collective: every rank of it creates its Wire together)."""

    def __init__(self, mpi_comm, label):
        self.comm = mpi_comm.Dup()
        self.rank, self.size, self.label = mpi_comm.rank, mpi_comm.size, label

    def __getattr__(self, name):  # Allreduce, Bcast, Send, Recv, Isend...
        return getattr(self.comm, name)

    def collective(self, kind):
        """Bracket one collective (a ``with`` block, or ``close()``)."""
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def close(self):
        """Close the collective opened by :meth:`collective`."""

    def test(self, requests):
        """Whether every request has completed (lets MPI progress them)."""
        return mpi.import_mpi().Request.Testall(requests)

    def wait(self, request):
        """Wait for a request of ``Iallreduce``, ``Isend`` or ``Irecv``."""
        request.Wait()

    def wait_until(self, done, what, on_stall=None):
        """Wait until ``done()`` holds (e.g. a CUDA event has passed)."""
        while not done():
            time.sleep(1e-4)

    def allgather_obj(self, obj):
        """Every rank's picklable ``obj``, in rank order."""
        return mpi.allgather_obj(self.comm, obj)

    def free(self):
        """Free the duplicate (collective)."""
        self.comm.Free()
