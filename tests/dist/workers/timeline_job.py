"""Timelines and explain under mpiexec: ``timeline_job.py OUT MODE``.

MODE ``atexit`` or ``finalize``: a naive communicator trains inside
``timeline.record(OUT/ctx.json)``, its last rank SLOW_S slower each step
than the others; then ``MINICHAIN_TIMELINE=OUT/env.json``
is set and a flat communicator trains, its trace written by
``comm.finalize()`` (``finalize``) or at process exit (``atexit``).
Each training: ``steps`` updates with a loss function (the first only
broadcasts), then one ``update()`` without one.

MODE ``explain``: every rank writes ``dist.explain(..., calibrate=True)`` to
OUT/explain<rank>.txt (rank 0 also prints it).
"""
import os
import sys
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from minichain import dist, optimizers  # noqa: E402
from minichain import functions as F  # noqa: E402
from minichain.dist.trace import timeline  # noqa: E402
from _models import MLP  # noqa: E402


SLOW_S = 0.2  # the last rank's extra time per step in the ctx.json run


def make_model(comm):
    model = MLP()
    rng = numpy.random.default_rng(comm.rank)
    x = rng.standard_normal((4, 5)).astype(numpy.float32)
    t = (numpy.arange(4) % 3).astype(numpy.int32)
    return model, x, t


def train(comm, steps, slow_rank=None):
    model, x, t = make_model(comm)
    opt = dist.create_multi_node_optimizer(optimizers.SGD(lr=0.1), comm)
    opt.setup(model)

    def loss(x, t):
        if comm.rank == slow_rank:
            time.sleep(SLOW_S)  # the others wait for this rank in the header
        return F.softmax_cross_entropy(model(x), t)

    for _ in range(steps):
        opt.update(loss, x, t)
    opt.update()  # the gradients of the last step, averaged again


def main(out_dir, mode):
    if mode == 'explain':
        comm = dist.create_communicator('flat')
        model, _, _ = make_model(comm)
        text = dist.explain(model, comm, batch_size=4, step_time=1e-3,
                            calibrate=True)
        with open(os.path.join(out_dir, 'explain{}.txt'.format(comm.rank)),
                  'w') as f:
            f.write(text)
        return
    naive = dist.create_communicator('naive')
    with timeline.record(os.path.join(out_dir, 'ctx.json'), naive):
        train(naive, 2, slow_rank=naive.size - 1)
    assert timeline.active is None
    path = os.path.join(out_dir, 'env.json')
    os.environ[timeline.ENV] = path
    flat = dist.create_communicator('flat')
    assert timeline.active is not None and timeline.active.owner is flat
    train(flat, 3)
    if mode == 'finalize':
        flat.finalize()
        assert timeline.active is None
        if flat.rank == 0:
            print('after finalize, env.json exists:', os.path.exists(path))


if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2])
