"""What the stall watchdog costs per collective: on against off, same run.

Run under MPI: ``mpiexec -n 2 python bench/watchdog_cost.py``. It creates
two flat communicators in one process, one with the watchdog on
(``MINICHAIN_STALL_TIMEOUT=600``: non-blocking MPI calls waited on in a test
loop) and one with it off (``0``: the blocking calls), and times the same
collectives on both, taking turns call by call so that load from other
processes hits them alike:

* ``wire 8 B``: one Allreduce of 8 bytes through the Wire (the waiting loop
  alone, no header);
* ``allreduce 3``: ``comm.allreduce`` of 3 floats (header + data);
* ``allreduce_obj``: ``comm.allreduce_obj`` of an int (what the training
  script's stop trigger does every iteration);
* ``mean_grad 4 KB`` / ``mean_grad 16 MB``: ``multi_node_mean_grad`` of a
  model with 10 parameters (one header, pipelined Allreduces of 4 MB);

plus ``raw 8 B``, mpi4py's blocking Allreduce of 8 bytes, for scale. It
prints microseconds per call (the median over repetitions of the slowest
rank's mean over a batch of calls) and the ratio on / off. ``--quick``:
fewer repetitions.
"""
import argparse
import os
import time

import numpy

import minichain
from minichain import dist


class GradModel(minichain.Link):
    """``n`` float32 parameters totalling ``nbytes``, gradients set."""

    def __init__(self, nbytes, n=10):
        super().__init__()
        with self.init_scope():
            for i in range(n):
                p = minichain.Parameter(numpy.zeros(nbytes // 4 // n,
                                                    numpy.float32))
                p.grad = numpy.ones_like(p.array)
                setattr(self, 'p{}'.format(i), p)


def make(timeout):
    os.environ['MINICHAIN_STALL_TIMEOUT'] = timeout
    return dist.create_communicator('flat')


def timed(world, fns, reps, batch):
    """Median over ``reps`` of the slowest rank's seconds per call, for each
    of ``fns`` (taking turns batch by batch)."""
    from mpi4py import MPI
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            world.Barrier()
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            ts.append((time.perf_counter() - t0) / batch)
    out = numpy.array([numpy.median(ts) for ts in times])
    world.Allreduce(MPI.IN_PLACE, out, op=MPI.MAX)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--quick', action='store_true')
    args = p.parse_args()
    from mpi4py import MPI
    on, off = make('600'), make('0')
    world = MPI.COMM_WORLD
    small = numpy.ones(1, numpy.float64)
    three = numpy.ones(3, numpy.float32)
    models = {'4 KB': GradModel(4 << 10), '16 MB': GradModel(16 << 20)}

    def cases(comm):
        def wire():
            comm.wire.Allreduce(MPI.IN_PLACE, small, op=MPI.SUM)
        return [('wire 8 B', wire, 2000),
                ('allreduce 3', lambda: comm.allreduce(three), 500),
                ('allreduce_obj', lambda: comm.allreduce_obj(1), 500),
                ('mean_grad 4 KB',
                 lambda: comm.multi_node_mean_grad(models['4 KB']), 200),
                ('mean_grad 16 MB',
                 lambda: comm.multi_node_mean_grad(models['16 MB']), 5)]
    reps = 5 if args.quick else 21
    rows = []
    for (name, fn_on, batch), (_, fn_off, _) in zip(cases(on), cases(off)):
        t_on, t_off = timed(world, [fn_on, fn_off], reps, batch)
        rows.append((name, t_on, t_off))
    raw = timed(world, [lambda: world.Allreduce(MPI.IN_PLACE, small,
                                                op=MPI.SUM)], reps, 2000)[0]
    if world.rank == 0:
        print('watchdog cost per collective, {} ranks ({} repetitions; '
              'microseconds per call)'.format(world.size, reps))
        print('{:<16} {:>10} {:>10} {:>8}'.format('collective', 'on', 'off',
                                                  'on/off'))
        for name, t_on, t_off in rows:
            print('{:<16} {:>10.2f} {:>10.2f} {:>8.3f}'.format(
                name, t_on * 1e6, t_off * 1e6, t_on / t_off))
        print('{:<16} {:>10} {:>10.2f}'.format('raw 8 B', '', raw * 1e6))


if __name__ == '__main__':
    main()
