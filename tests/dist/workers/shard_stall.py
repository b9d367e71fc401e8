"""A rank that never joins a sharded state's reduce-scatter:
``shard_stall.py COMMUNICATOR``.

Run under ``mpiexec -n 3`` with a short MINICHAIN_STALL_TIMEOUT. Two
updates with ``shard_state=True``; in the second, rank 1 sleeps after the
step's header, just before the reduce-scatter, so that the others wait in
it (MPI's Reduce_scatter on flat, the ring's first phase on ring). The
watchdog must end the job naming rank 1 and the reduce-scatter.
"""
import os
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

import minichain  # noqa: E402
from minichain import dist, optimizers  # noqa: E402

comm = dist.create_communicator(sys.argv[1])
model = minichain.Sequential(minichain.links.Linear(30, 100))
model(numpy.zeros((1, 30), numpy.float32))
opt = dist.create_multi_node_optimizer(optimizers.MomentumSGD(), comm,
                                       shard_state=True).setup(model)
opt.broadcast_params()


def update():
    for _, p in model.namedparams():
        p.grad = numpy.ones_like(p.array)
    opt.update()


update()
if comm.rank == 1:
    def sleeping(buf):
        print('[rank 1] reduce-scatter 2 of rank 1: sleeping', flush=True)
        time.sleep(600)
    comm.reduce_scatter = sleeping
update()
print('[rank {}] all done'.format(comm.rank), flush=True)
