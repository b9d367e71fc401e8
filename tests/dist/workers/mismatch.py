"""Rank 1 builds a different model: every rank must raise the same error.

Each rank writes the message it got to OUT/rank<r>.txt, waits for the
others, then re-raises: the abort hook ends the job.
"""
import os
import sys

import numpy

import minichain
from minichain import dist
from minichain import links as L
from minichain import optimizers

out_dir = sys.argv[1]
comm = dist.create_communicator(sys.argv[2])
width = 5 if comm.rank == 1 else 4
model = minichain.Sequential(L.Linear(3, width), L.Linear(width, 2))
opt = dist.create_multi_node_optimizer(optimizers.SGD(), comm).setup(model)
x = numpy.ones((2, 3), dtype=numpy.float32)
try:
    opt.update(lambda: minichain.functions.sum(model(x)))
except dist.ModelMismatchError as e:
    with open(os.path.join(out_dir, 'rank{}.txt'.format(comm.rank)), 'w') as f:
        f.write(str(e))
    comm.mpi_comm.Barrier()
    raise
print('rank {}: no error'.format(comm.rank), flush=True)
