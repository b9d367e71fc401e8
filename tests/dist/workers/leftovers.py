"""A job that ends in one of several ways, after naming MPICH's and
Hydra's files of this rank in argv[2]/files<rank>.json (read from /proc,
independently of minichain's own lookup). argv[1] is 'normal', 'raise'
(rank 1 raises: the abort hook), 'stall' (rank 1 sleeps: the watchdog
aborts) or 'kill' (rank 1 SIGKILLs itself: the launcher ends the job)."""
import json
import os
import signal
import sys
import time

import numpy
from mpi4py import MPI  # noqa: F401  (MPI_Init: the files exist now)

from minichain import dist


def files_of_this_rank():
    with open('/proc/self/maps') as f:
        found = {line.split()[-1] for line in f
                 if '/dev/shm/mpich_shm_' in line}
    fd_dir = '/proc/{}/fd'.format(os.getppid())
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if 'hydra_hwloc_xmlfile_' in target:
            found.add(target)
    return sorted(found)


how, folder = sys.argv[1:3]
rank = MPI.COMM_WORLD.rank
with open(os.path.join(folder, 'files{}.json'.format(rank)), 'w') as f:
    json.dump(files_of_this_rank(), f)
comm = dist.create_communicator('flat')
comm.allreduce(numpy.ones(1))
if comm.rank == 1:
    if how == 'raise':
        raise RuntimeError('boom on rank 1')
    if how == 'stall':
        time.sleep(120)
    if how == 'kill':
        os.kill(os.getpid(), signal.SIGKILL)
comm.allreduce(numpy.ones(1))
