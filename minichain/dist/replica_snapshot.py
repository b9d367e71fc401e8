"""multi_node_snapshot with ChainerMN's replica sets.

``dist.multi_node_snapshot(comm, snapshot, [0])`` (a list where minichain's
own form takes the root) follows ChainerMN 7: the ranks are cut into *replica
sets*, ranks whose trainers hold the same state (rank 0, with its LogReport
and PrintReport, alone; the others together). The lowest rank of each set
writes its own file, ``<filename>.<rank>``, and with ``autoload`` reads its
newest one at the start and sends it to the rest of its set. A trainer that
differs between ranks is thus saved whole, and a restart with another
number of ranks still finds the files of ranks 0 and 1.

====================  ======  =============================
``replica_sets``      ranks   sets
====================  ======  =============================
``[0]``               4       {0}, {1, 2, 3}
``[0, 1]``            4       {0}, {1}, {2, 3}
``[[0, 1], [2, 3]]``  4       {0, 1}, {2, 3}
``[]``                4       {0, 1, 2, 3}
====================  ======  =============================
"""
import io
import numbers

from minichain.dist import mpi
from minichain.serializers import load_npz, save_npz
from minichain.training import extension


def parse_replica_sets(replica_sets, size):
    """The list of sets of ranks: each entry of ``replica_sets`` (a rank,
    or an iterable of ranks) is a set; the ranks left over form one more."""
    sets = [{r} if isinstance(r, numbers.Integral) else set(r)
            for r in replica_sets]
    seen = [r for s in sets for r in s]
    bad = [r for r in seen if not 0 <= r < size]
    if bad or len(seen) != len(set(seen)):
        raise ValueError('multi_node_snapshot: replica sets {!r} must hold '
                         'ranks of 0-{} at most once each'.format(
                             replica_sets, size - 1))
    rest = set(range(size)) - set(seen)
    return sets + ([rest] if rest else [])


class ReplicaSetsSnapshot(extension.Extension):
    """The snapshot extension ``snapshot`` written by the lowest rank of
    each replica set of ``comm`` (see the module docstring)."""

    def __init__(self, comm, snapshot, replica_sets):
        self.comm, self.snapshot = comm, snapshot
        mine = next(s for s in parse_replica_sets(replica_sets, comm.size)
                    if comm.rank in s)
        self.master, self.replica_set = min(mine), sorted(mine)
        snapshot.filename = '{}.{}'.format(snapshot.filename, comm.rank)
        self.trigger = getattr(snapshot, 'trigger', (1, 'epoch'))
        self.priority = getattr(snapshot, 'priority',
                                extension.PRIORITY_SNAPSHOT)

    @property
    def is_master(self):
        """Whether this rank writes its set's snapshots."""
        return self.comm.rank == self.master

    def initialize(self, trainer):
        """With the snapshot's ``autoload``: the master loads its newest
        file, if any, and sends what it loaded to the rest of its set."""
        if self.is_master:
            self.snapshot.initialize(trainer)
        if not self.snapshot.autoload:
            return
        target = self.snapshot.target
        target = trainer if target is None else target
        if self.is_master:
            data = None
            if self.snapshot.autoloaded is not None:
                buf = io.BytesIO()
                save_npz(buf, target)
                data = buf.getvalue()
            for rank in self.replica_set:
                if rank != self.master:
                    self.comm.send_obj(data, rank, mpi.TAG_SNAPSHOT)
        else:
            data = self.comm.recv_obj(self.master, tag=mpi.TAG_SNAPSHOT)
            if data is not None:
                load_npz(io.BytesIO(data), target)

    def __call__(self, trainer):
        if self.is_master:
            self.snapshot(trainer)

    def finalize(self):
        if self.is_master and hasattr(self.snapshot, 'finalize'):
            self.snapshot.finalize()
