"""Gradient-averaging cost against a raw MPI Allreduce of the same bytes.

Run under MPI, e.g. ``mpiexec -n 2 python bench/allreduce.py``. For each
message size (float32 gradient bytes) and each communicator it times
``comm.multi_node_mean_grad(model)`` on a model whose gradients total that
many bytes (split over ``--params`` parameters, as a network has many
tensors) against a raw ``MPI.Allreduce(IN_PLACE)`` of one buffer of the
same bytes in the same run (``raw``), and against raw Allreduces of the
same buffer in the flat communicator's pipeline chunks (``raw4M``: large
single messages are slow in MPICH's shared-memory path, which is why flat
chunks), and against raw Allreduces in the same chunks of the
gradients' own arrays (``ratioG``: one allocation per parameter, as
backward makes them, where a single large allocation such as ``raw``'s
gets transparent huge pages: what an averaging that copied nothing would
cost). It prints median times, the ratios ours/raw and ours/raw4M, and
the bus bandwidth ``bytes * 2 (P - 1) / P / time`` (the nccl-tests
convention). Times are the slowest rank's; the timed calls take turns
so that load from other processes hits them alike, and the ratios are
medians of the pairs of one repetition (ours/raw4M with its 10th-90th
percentiles). Setting the fresh gradients before each averaging
(backward's work) is not timed. ``flat:bare`` is the flat protocol
without its layers (no guards, no timeline, one piece): what the layers
cost. ``--quick`` stops at 4 MB.

A second table puts the ring communicator's allreduce alone
(``minichain/dist/ring.py``, on one buffer: no packing) beside MPI's own
Allreduce of the same buffer, from 1 MB, with the ring model's prediction:
the ring is ``2(P - 1)`` steps, in each of which every rank sends ``n / P``
bytes to its right neighbour while receiving as many from its left one.
One such step is timed alone (``step ms``), and the model predicts
``2(P - 1)`` times it, a bus bandwidth of ``(n / P) / step``: the link's,
whatever ``P``. What the ring loses against its model is the additions of
the reduce-scatter and Python's work between the steps.
"""
import argparse
import time

import numpy

import minichain
from minichain import dist, host
from minichain.dist import ring as ring_module
from minichain.dist.transports.pipeline import PIPELINE_BYTES

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 100 << 20,
         128 << 20]


class GradModel(minichain.Link):
    """A link with ``n`` float32 parameters totalling ``nbytes``."""

    def __init__(self, nbytes, n):
        super().__init__()
        elems = nbytes // 4
        sizes = [elems // n + (1 if i < elems % n else 0) for i in range(n)]
        with self.init_scope():
            for i, size in enumerate(sizes):
                setattr(self, 'p{:03d}'.format(i), minichain.Parameter(
                    numpy.zeros(size, dtype=numpy.float32)))


def _timed(comm, fns, reps):
    """Seconds of each call of each of ``fns``, ``(len(fns), reps)``: the
    slowest rank's.

    The functions take turns within every repetition, so that load from
    other processes on the machine hits them alike, and neighbours in a
    repetition make a pair whose ratio that load changes little. Every
    other repetition takes them in reverse order: a call right after
    another that ran the same code (the layered and the bare averaging)
    finds it warm in the caches, and at 4 KB that alone moved their
    ratio by 1-2%.
    """
    from mpi4py import MPI
    times = numpy.zeros((len(fns), reps))
    order = list(enumerate(fns))
    for i in range(reps):
        for k, fn in order if i % 2 == 0 else order[::-1]:
            getattr(fn, 'before', lambda: None)()  # untimed
            comm.mpi_comm.Barrier()
            t0 = time.perf_counter()
            fn()
            times[k, i] = time.perf_counter() - t0
    comm.mpi_comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return times


def _ratio(ours, base):
    """The median of the paired ratios and their 10th-90th percentiles."""
    r = ours / base
    return numpy.median(r), numpy.percentile(r, 10), numpy.percentile(r, 90)


def _mean_grad_step(comm, nbytes, n_params):
    model = GradModel(nbytes, n_params)
    grads = [numpy.full(q.shape, comm.rank, dtype=numpy.float32)
             for q in model.params()]

    def fresh_grads():  # as after a backward (which sets them)
        for q, g in zip(model.params(), grads):
            q.grad = g

    def step():
        comm.multi_node_mean_grad(model)
    step.before = fresh_grads
    fresh_grads()
    step()  # allocate the packed buffer outside the timing
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--communicators', default='naive,flat,flat:bare,ring',
                        help='names; NAME:bare is the bare protocol '
                        '(create_communicator(NAME, layers=()): no guards, '
                        'no timeline, no pipeline)')
    parser.add_argument('--params', type=int, default=16,
                        help='parameters the gradient bytes are split into')
    parser.add_argument('--quick', action='store_true')
    args = parser.parse_args()
    from mpi4py import MPI
    comms = {}
    for name in args.communicators.split(','):
        base, _, bare = name.partition(':')
        comms[name] = dist.create_communicator(
            base, layers=() if bare == 'bare' else None)
    world = next(iter(comms.values()))
    p = world.size
    sizes = [s for s in SIZES if s <= (4 << 20)] if args.quick else SIZES
    if world.rank == 0:
        print('ranks: {}; gradients float32 in {} parameters; times: median '
              'of the slowest rank'.format(p, args.params))
        print('{:>9} {:>10} {:>9} {:>9} {:>9} {:>6} {:>16} {:>7} {:>7} {:>7}'
              .format('bytes', 'comm', 'ours ms', 'raw ms', 'raw4M ms',
                      'ratio', 'ratio4M (10-90%)', 'ratioG', 'ours',
                      'raw'))
        print('{:>102}'.format('(bus GB/s)'))
    for nbytes in sizes:
        # Below 4 MB more repetitions than the ring's table: at 4 KB a call
        # is ~0.1 ms and the ratio of the layers to the bare protocol, a
        # few microseconds in a hundred, moved by 5% between runs of 100.
        reps = max(7, min(2000, int(4e8 // nbytes)))
        raw = numpy.ones(nbytes // 4, dtype=numpy.float32)
        step = PIPELINE_BYTES // 4

        def raw_chunked():
            for lo in range(0, raw.size, step):
                world.mpi_comm.Allreduce(MPI.IN_PLACE, raw[lo:lo + step])
        # The same bytes in the gradients' own arrays (one allocation per
        # parameter, as backward makes them): what an averaging that
        # copied nothing would pay at least.
        grads = [q.array for q in GradModel(nbytes, args.params).params()]

        def raw_in_grads():
            for g in grads:
                for lo in range(0, g.size, step):
                    world.mpi_comm.Allreduce(MPI.IN_PLACE, g[lo:lo + step])
        fns = [lambda: world.mpi_comm.Allreduce(MPI.IN_PLACE, raw),
               raw_chunked, raw_in_grads]
        fns += [_mean_grad_step(c, nbytes, args.params)
                for c in comms.values()]
        times = _timed(world, fns, reps)
        if world.rank != 0:
            continue
        t = numpy.median(times, axis=1)
        bus = nbytes * 2 * (p - 1) / p / 1e9
        for k, name in enumerate(comms, start=3):
            ratio4m = _ratio(times[k], times[1])
            print('{:>9} {:>10} {:>9.3f} {:>9.3f} {:>9.3f} {:>6.2f} {:>5.2f} '
                  '({:.2f}-{:.2f}) {:>7.2f} {:>7.2f} {:>7.2f}'.format(
                      _human(nbytes), name, t[k] * 1e3, t[0] * 1e3,
                      t[1] * 1e3, _ratio(times[k], times[0])[0], *ratio4m,
                      _ratio(times[k], times[2])[0], bus / t[k],
                      bus / t[0]), flush=True)
        names = list(comms)
        for k, name in enumerate(names, start=3):
            if name + ':bare' in comms:  # what the layers cost
                bare = names.index(name + ':bare') + 3
                print('{:>9} {:>10} layers/bare {:.3f} ({:.3f}-{:.3f})'
                      .format('', name, *_ratio(times[k], times[bare])))
    if p > 1 and 'ring' in comms:
        ring_table(world, comms['ring'], sizes)


def ring_table(world, ring, sizes):
    """Rank 0 prints the ring alone against MPI's Allreduce and the model
    (see the module docstring)."""
    from mpi4py import MPI
    p = world.size
    if world.rank == 0:
        print('\nring allreduce of one float32 buffer against MPI\'s '
              'Allreduce (bus GB/s), and the ring model: 2(P-1) steps of '
              'n/P bytes each')
        print('{:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>6} {:>6}'.format(
            'bytes', 'mpi ms', 'ring ms', 'step ms', 'mpi', 'ring',
            'model', 'r/mpi', 'r/mod'))
    for nbytes in [s for s in sizes if s >= 1 << 20]:
        reps = max(7, min(100, int(4e8 // nbytes)))
        # zeros: summed in place again and again, ones would overflow
        buf = numpy.zeros(nbytes // 4, dtype=numpy.float32)
        n = buf.size // p
        send, recv = numpy.ones(n, numpy.float32), numpy.empty(n, numpy.float32)
        fns = [lambda: world.mpi_comm.Allreduce(MPI.IN_PLACE, buf),
               lambda: ring.sum_on_host(buf),
               lambda: [ring.wait_request(q) for q in
                        ring_module.exchange(ring.wire, send, recv)]]
        t_mpi, t_ring, t_step = numpy.median(_timed(world, fns, reps), axis=1)
        if world.rank != 0:
            continue
        bus = nbytes * 2 * (p - 1) / p / 1e9
        t_model = 2 * (p - 1) * t_step
        print('{:>9} {:>9.3f} {:>9.3f} {:>9.3f} {:>7.2f} {:>7.2f} {:>7.2f} '
              '{:>6.2f} {:>6.2f}'.format(
                  _human(nbytes), t_mpi * 1e3, t_ring * 1e3, t_step * 1e3,
                  bus / t_mpi, bus / t_ring, bus / t_model, t_mpi / t_ring,
                  t_model / t_ring), flush=True)


def _human(n):
    return ('{:g}MB'.format(n / (1 << 20)) if n >= 1 << 20
            else '{:g}KB'.format(n / 1024))


if __name__ == '__main__':
    host.tune_malloc()  # reuse freed buffers, as training does
    main()
