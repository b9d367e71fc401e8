"""One rank of bench/scaling.py's MPI jobs: the timed data-parallel step.

Each rank times every step and the gradient communication inside it, then
rank 0 prints every rank's timings as JSON (``_interleave.serve``). Without
overlap the communication is ``comm.multi_node_mean_grad``: a barrier first
(the wait for the slower rank, timed apart), then the averaging. With
overlap it is what the step spends on buckets on the compute thread: in the
hooks during backward (packing, posting, testing) and in
``Reducer.finish`` after it (the wait for the last buckets, which holds the
wait for the slower rank, and the unpacking): together the communication
the step does not hide.

Progress of the buckets in flight (the driver's ``--progress``, given to
the rank as ``--rank-progress``): ``nodes``, a test after every function
of backward (minichain's way); ``poll``, tests in the gradient-ready hooks
only (``Reducer.poll_between_nodes = False``); ``async``, MPICH's progress
thread (the driver sets ``MPIR_CVAR_ASYNC_PROGRESS=1``) on top of
``nodes``.
"""
import os
import resource
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _TimedComm:
    """Times each ``multi_node_mean_grad`` of ``comm``: a barrier first
    (time waiting for the slower rank), then the averaging itself."""

    def __init__(self, comm):
        self.comm, self.wait, self.mean = comm, [], []
        self._inner = comm.multi_node_mean_grad
        comm.multi_node_mean_grad = self  # an instance attribute wins

    def __call__(self, model, zero_fill=False):
        t0 = time.perf_counter()
        self.comm.mpi_comm.Barrier()
        t1 = time.perf_counter()
        self._inner(model, zero_fill)
        t2 = time.perf_counter()
        self.wait.append(t1 - t0)
        self.mean.append(t2 - t1)


class _TimedReducer:
    """Times an overlap Reducer's work on the compute thread: ``mean`` per
    step is the hooks' (launching and testing buckets during backward),
    ``wait`` the ``finish`` after backward."""

    def __init__(self, reducer):
        self.reducer, self.wait, self.mean = reducer, [], []
        self._hooks = 0.0
        for name in ('_launch', '_poll'):
            setattr(reducer, name, self._timed(getattr(reducer, name)))
        self._finish = reducer.finish
        reducer.finish = self.finish

    def _timed(self, fn):
        def timed(*args):
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self._hooks += time.perf_counter() - t0
        return timed

    def finish(self, *args):
        hooks, t0 = self._hooks, time.perf_counter()
        self._finish(*args)
        self.wait.append(time.perf_counter() - t0)
        self.mean.append(hooks)  # the launches inside finish count there
        self._hooks = 0.0


def run_rank(args):
    """One rank: time ``args.warmup + args.steps`` data-parallel steps;
    rank 0 prints the JSON summary of every rank's timings."""
    sys.path.insert(0, ROOT)
    import _interleave
    from mpi4py import MPI
    from minichain import dist, host, optimizers
    from models.resnet import ResNet, loss_and_accuracy
    host.tune_malloc()  # reuse freed activation buffers (minichain.host)
    comm = dist.create_communicator(args.communicator)
    model = ResNet(args.arch, 1000, args.stem)
    opt = optimizers.MomentumSGD(lr=0.01, momentum=0.9)
    if not args.no_comm:  # else each rank steps on its own gradients
        opt = dist.create_multi_node_optimizer(
            opt, comm, overlap=bool(args.rank_progress),
            bucket_mb=args.bucket_mb)
    opt.setup(model)
    rng = numpy.random.default_rng(comm.rank)
    x = rng.standard_normal((args.batch, 3, args.size, args.size),
                            dtype=numpy.float32)
    t = rng.integers(0, 1000, args.batch).astype(numpy.int32)
    opt.update(loss_and_accuracy, model, x, t)  # multi-node: broadcasts only
    if args.no_comm:
        timer = None
    elif args.rank_progress:
        timer = _TimedReducer(opt.reducer)
        # minichain tests the buckets after every backward function
        # ('nodes'); 'poll' leaves that to the hooks alone.
        opt.reducer.poll_between_nodes = args.rank_progress != 'poll'
    else:
        timer = _TimedComm(comm)
    steps, cpu = [], []

    def step():
        comm.mpi_comm.Barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        opt.update(loss_and_accuracy, model, x, t)
        steps.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        return comm.mpi_comm.allreduce(steps[-1], op=MPI.MAX)

    def finish():
        n = args.warmup
        zeros = [0.0] * len(steps)
        mine = {'step': steps[n:], 'cpu': cpu[n:],
                'wait': (timer.wait if timer else zeros)[n:],
                'mean': (timer.mean if timer else zeros)[n:],
                'rss_mib': resource.getrusage(
                    resource.RUSAGE_SELF).ru_maxrss / 1024.0}
        ranks = comm.mpi_comm.gather(mine, root=0)
        grad_bytes = sum(p.grad.nbytes for p in model.params())
        buckets = (len(opt.reducer.plan.buckets) if args.rank_progress
                   else 0)
        return {'ranks': ranks, 'grad_bytes': grad_bytes, 'buckets': buckets}

    _interleave.serve(step, args.warmup, finish, rank=comm.rank)
