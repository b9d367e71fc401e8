"""Every averaging mode equals one process, on the bare protocol: bare.py.

Under ``mpiexec -n N``, for the naive, flat and ring communicators made
with ``layers=()`` (and again with the installed layers, when any is), and
for each averaging mode that runs on the CPU (after backward, overlapped,
accumulate=2, both, sharded state), each rank trains a float64 MLP for
three steps on its shard of a batch and checks its parameters against one
process trained on the whole batch, to 1e-10. Nothing here imports a
layer: ``make test-peeled`` runs it with every layer folder deleted.
Each rank prints ``BARE-OK rank R CASES`` at the end.
"""
import os

import numpy

import minichain
from minichain import dist, functions as F, links as L, optimizers

BATCH, STEPS, TOL = 12, 3, 1e-10
MODES = {  # name -> create_multi_node_optimizer's options
    'after backward': {},
    'overlap': {'overlap': True, 'bucket_mb': 1e-4},
    'accumulate': {'accumulate': 2},
    'overlap + accumulate': {'overlap': True, 'accumulate': 2,
                             'bucket_mb': 1e-4},
    'sharded': {'shard_state': True},
}


class MLP(minichain.Chain):
    def __init__(self):
        super().__init__()
        init = numpy.random.default_rng(0)
        with self.init_scope():
            self.l1 = L.Linear(5, 7, initialW=init.standard_normal((7, 5)))
            self.l2 = L.Linear(7, 3, initialW=init.standard_normal((3, 7)))
        for p in self.params():  # float64 throughout, biases included
            p.array = p.array.astype(numpy.float64)

    def forward(self, x):
        return self.l2(F.tanh(self.l1(x)))


def data():
    rng = numpy.random.default_rng(1)
    return (rng.standard_normal((STEPS, BATCH, 5)),
            rng.integers(0, 3, (STEPS, BATCH)).astype(numpy.int32))


def loss_of(model):
    return lambda x, t: F.softmax_cross_entropy(model(x), t)


def one_process():
    """The reference: the whole batch, one process."""
    model = MLP()
    opt = optimizers.MomentumSGD(lr=0.1).setup(model)
    for x, t in zip(*data()):
        opt.update(loss_of(model), x, t)
    return [p.array for p in model.params()]


def data_parallel(comm, options):
    """This rank's shard, ``accumulate`` micro-batches per step."""
    model = MLP()
    opt = dist.create_multi_node_optimizer(
        optimizers.MomentumSGD(lr=0.1), comm, **options).setup(model)
    opt.broadcast_params()
    passes = options.get('accumulate', 1)
    per_rank = BATCH // comm.size
    for x, t in zip(*data()):
        mine = slice(comm.rank * per_rank, (comm.rank + 1) * per_rank)
        for xs, ts in zip(numpy.split(x[mine], passes),
                          numpy.split(t[mine], passes)):
            opt.update(loss_of(model), xs, ts)
    return [p.array for p in model.params()]


def main():
    want = one_process()
    stacks = [('bare', ())]
    if dist.default_layers():
        stacks.append(('layered', None))
    cases = 0
    for name in ('naive', 'flat', 'ring'):
        for label, layers in stacks:
            comm = dist.create_communicator(name, layers=layers)
            assert BATCH % (2 * comm.size) == 0, 'run on 2 or 3 ranks'
            for mode, options in MODES.items():
                if options.get('overlap') and not comm.can_overlap:
                    continue
                got = data_parallel(comm, options)
                for a, b in zip(got, want):
                    err = float(numpy.max(numpy.abs(a - b)))
                    assert err < TOL, '{} {} {}: off by {:.3g}'.format(
                        name, label, mode, err)
                cases += 1
            comm.finalize()
    rank = dist.create_communicator('flat', layers=()).rank
    os.write(1, 'BARE-OK rank {} {}\n'.format(rank, cases).encode())


if __name__ == '__main__':
    main()
