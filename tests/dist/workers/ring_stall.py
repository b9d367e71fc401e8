"""A rank that leaves the ring in the middle: ``ring_stall.py CASE``.

Run under ``mpiexec -n 3`` with a short MINICHAIN_STALL_TIMEOUT. The ring
communicator averages twice; in the second averaging rank 1, at the start
of its second ring step, sleeps ('sleep') or ends its program ('exit'),
so that rank 2 waits for a chunk that never comes and rank 0 for the
chunks rank 2 would pass on. The watchdog must end the job naming rank 1.
"""
import os
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

import minichain  # noqa: E402
from minichain import dist  # noqa: E402
from minichain.dist import ring  # noqa: E402

case = sys.argv[1]
comm = dist.create_communicator('ring')
model = minichain.Sequential(minichain.links.Linear(30, 100))
model(numpy.zeros((1, 30), numpy.float32))


def average():
    for _, p in model.namedparams():
        p.grad = numpy.ones_like(p.array)
    comm.multi_node_mean_grad(model)


average()
if comm.rank == 1:
    exchange, steps = ring.exchange, []

    def leaving(wire, send, recv):
        steps.append(1)
        if len(steps) == 2:
            print('[rank 1] ring step 2 of rank 1: leaving ({})'.format(case),
                  flush=True)
            if case == 'exit':
                sys.exit(3)
            time.sleep(600)
        return exchange(wire, send, recv)
    ring.exchange = leaving
average()
print('[rank {}] all done'.format(comm.rank), flush=True)
