"""Rank 1 raises while rank 0 waits in a collective: the job must end."""
import numpy

from minichain import dist

comm = dist.create_communicator('flat')
comm.mpi_comm.Barrier()
if comm.rank == 1:
    raise RuntimeError('boom on rank 1')
comm.allreduce(numpy.ones(3))  # never completes: rank 1 is gone
print('rank {} passed the collective'.format(comm.rank), flush=True)
