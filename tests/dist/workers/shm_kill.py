"""One rank ends at a named point of the first averaging through shared
memory: ``shm_kill.py POINT VICTIM HOW FOLDER``.

The shared-memory layer makes its file in FOLDER (a private folder of
/dev/shm, so that the test sees only this job's files). Rank VICTIM ends
at POINT, by HOW ('kill': SIGKILL, as the OOM killer or a node's
scheduler would; 'raise': an exception, the abort hook's MPI_Abort):

  map      entering map_regions (no file yet)
  made     rank 0 only: the file made, nothing sent yet
  gather1  before the first message of map_regions
  gather2  before the second (rank 0 has mapped the file; the others too)
  sum      in the sum, before its first barrier (every rank has mapped it)
  done     after the first averaging
  none     no rank ends: the job finishes (the control)

Each rank prints ``SHM-USED rank R`` once the averaging went through the
file (so the test knows the layer was on).
"""
import os
import signal
import sys

import numpy

from minichain import dist
from minichain import links as L
from minichain.dist import mpi
from minichain.dist.transports import shared_memory

point, victim, how, folder = sys.argv[1], int(sys.argv[2]), *sys.argv[3:5]
shared_memory._shm_dir = lambda: folder
comm = dist.create_communicator('flat')
assert comm.shares_memory()


def end(at):
    if at == point and comm.rank == victim:
        if how == 'kill':
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError('rank {} ends at {}'.format(victim, at))


class Messages:
    """The transport module as map_regions sees it, counting its
    messages."""
    sent = 0

    def __getattr__(self, name):
        return getattr(mpi, name)

    def allgather_obj(self, wire, obj):
        Messages.sent += 1
        end('gather{}'.format(Messages.sent))
        return mpi.allgather_obj(wire, obj)


made, mapped, summed = (os.posix_fallocate, shared_memory.map_regions,
                        comm._sum_in_place)


def fallocate(fd, offset, length):
    made(fd, offset, length)
    end('made')


def map_regions(wire, dtype, n):
    end('map')
    return mapped(wire, dtype, n)


def sum_in_place(regions, lo, hi):
    end('sum')
    return summed(regions, lo, hi)


os.posix_fallocate = fallocate
shared_memory.mpi = Messages()
shared_memory.map_regions = map_regions
comm._sum_in_place = sum_in_place

model = L.Linear(512, 512)  # 1 MB of gradients: summed in the file
model(numpy.zeros((1, 512), numpy.float32))
for p in model.params():
    p.grad = numpy.full(p.shape, comm.rank, numpy.float32)
comm.multi_node_mean_grad(model)
assert comm._regions.get(model) is not None  # it went through the file
assert (model.W.grad == (comm.size - 1) / 2).all()
print('SHM-USED rank {}'.format(comm.rank), flush=True)
end('done')
comm.finalize()
