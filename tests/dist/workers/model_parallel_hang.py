"""Two ranks that wait for each other in model-parallel code:
``model_parallel_hang.py CASE`` under ``mpiexec -n 2``.

* ``send-first``: both send first, a message too big for MPI to buffer
  (8 MB), so neither send completes before the other rank receives;
* ``recv-first``: both receive first.

Either must end the job with the watchdog's report naming both ranks,
within seconds, not hang until the stall timeout.
"""
import os
import sys

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

import minichain  # noqa: E402
from minichain import dist  # noqa: E402
from minichain.dist import functions as DF  # noqa: E402

case = sys.argv[1]
comm = dist.create_communicator('naive')
peer = 1 - comm.rank
x = minichain.Variable(numpy.ones(1 << 20))
if case == 'send-first':
    DF.send(x, comm, peer)
    DF.recv(comm, peer)
elif case == 'recv-first':
    DF.recv(comm, peer)
    DF.send(x, comm, peer)
else:
    raise SystemExit('unknown case ' + case)
print('[rank {}] done'.format(comm.rank), flush=True)
