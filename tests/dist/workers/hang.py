"""Ways for one rank to leave the others waiting: ``hang.py CASE``.

Run under ``mpiexec -n 2`` with a short MINICHAIN_STALL_TIMEOUT; every case
but 'control' must end the job quickly with a message naming the ranks.
"""
import os
import signal
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)

import minichain  # noqa: E402
from minichain import dist  # noqa: E402
from minichain import functions as F  # noqa: E402
from minichain import links as L  # noqa: E402
from minichain import optimizers  # noqa: E402

case = sys.argv[1]
if case == 'sigterm':  # before MPI starts, as the training script does
    from minichain.training.triggers.stop_on_signal import (
        _caught, catch_stop_signals)
    catch_stop_signals()
    noted = signal.getsignal(signal.SIGTERM)

    def announce(signum, frame):
        noted(signum, frame)
        print('[rank 0] noted signal {}'.format(_caught['signum']),
              flush=True)
    signal.signal(signal.SIGTERM, announce)

comm = dist.create_communicator('flat')
rank = comm.rank
x = numpy.ones(3)


def model_and_optimizer(bn=False, overlap=False):
    layers = [L.Linear(3, 4)] + ([L.BatchNormalization(4)] if bn else []) \
        + [L.Linear(4, 2)]
    model = minichain.Sequential(*layers)
    model(numpy.zeros((2, 3), numpy.float32))
    if bn:
        model = dist.create_mnbn_model(model, comm)
    opt = dist.create_multi_node_optimizer(optimizers.SGD(lr=0.1), comm,
                                           overlap=overlap, bucket_mb=1e-4)
    return model, opt.setup(model)


def step(model, opt, fail=False):
    def loss():
        if fail:
            raise ValueError('a bad batch on rank {}'.format(rank))
        data = numpy.random.default_rng(rank).standard_normal((4, 3))
        return F.sum(model(data.astype(numpy.float32)))
    opt.update(loss)


comm.allreduce(x)
if case == 'control':
    # Same collectives on both ranks, with waits longer than the notice
    # (so notes go back and forth) and rank 0 leaving first.
    for i in range(3):
        if rank == 1:
            time.sleep(0.8)
        comm.allreduce(x)
    model, opt = model_and_optimizer()
    for _ in range(3):
        step(model, opt)
    if rank == 1:
        time.sleep(0.8)
    comm.bcast_obj('bye' if rank == 0 else None)
elif case == 'return':
    if rank == 0:
        comm.allreduce(x)
elif case == 'exit':
    if rank == 1:
        sys.exit(3)
    comm.allreduce(x)
elif case == 'kinds':
    if rank == 0:
        comm.allreduce(x)
    else:
        comm.bcast(x)
elif case in ('caught', 'caught-overlap'):
    model, opt = model_and_optimizer(overlap=case.endswith('overlap'))
    for i in range(3):
        try:
            step(model, opt, fail=(rank == 1 and i == 1))
        except ValueError:
            continue  # the user's code moves on
    comm.allreduce_obj(rank)  # e.g. a report after the loop
elif case in ('uneven', 'uneven-overlap'):
    model, opt = model_and_optimizer(overlap=case.endswith('overlap'))
    for _ in range(5 if rank == 0 else 3):  # 4 updates and 2 updates
        step(model, opt)
elif case == 'mnbn':
    model, opt = model_and_optimizer(bn=True)
    step(model, opt)
    with minichain.using_config('train', rank == 0):
        step(model, opt)
elif case == 'shared-exit':
    # rank 1 leaves between packing and the shared-memory sum: rank 0
    # waits in that sum's barrier (transports/shared_memory.py)
    model = L.Linear(512, 512)  # 1 MB of gradients: summed in the file
    model(numpy.zeros((1, 512), numpy.float32))
    for p in model.params():
        p.grad = numpy.ones_like(p.array)
    assert comm.shares_memory()
    if rank == 1:
        def leave(regions, lo, hi):
            sys.exit(3)
        comm._sum_in_place = leave
    comm.multi_node_mean_grad(model)
elif case == 'slow':
    if rank == 1:
        time.sleep(3.6)  # slow, not stuck: the job goes on
    comm.allreduce(x)
elif case == 'silent':
    if rank == 1:
        time.sleep(600)  # busy elsewhere, e.g. a stuck data loader
    comm.allreduce(x)
elif case == 'nccl':
    # rank 1 never joins rank 0's NCCL averaging (busy elsewhere): an event
    # after NCCL work that never passes, as on a GPU; the watchdog must
    # abort the NCCL communicator and end the job
    nccl_comm = dist.create_communicator('pure_nccl')

    class FakeNcclComm:
        def abort(self):
            print('[rank {}] fake NCCL communicator aborted'.format(rank),
                  flush=True)

    nccl_comm.nccl_comm = FakeNcclComm()
    nccl_comm.in_flight = type('Never', (), {'done': False})()
    if rank == 1:
        time.sleep(600)
    with nccl_comm.wire.collective('multi_node_mean_grad'):
        nccl_comm.wait_in_flight()
elif case == 'stopped' or case == 'sigterm':
    print('[rank {}] pid {}'.format(rank, os.getpid()), flush=True)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    comm.allreduce(x)
elif case == 'deadlock':
    if rank == 0:
        comm.recv_obj(1)
    else:
        comm.allreduce(x)
else:
    raise SystemExit('unknown case ' + case)
print('[rank {}] done'.format(rank), flush=True)
