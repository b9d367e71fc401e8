"""The bare protocol and its layers under mpiexec: ``layers.py``.

Each rank prints ``LAYERS-OK rank R`` after checking that
- a communicator made with ``layers=()`` is the bare protocol (its wire is
  the plain one, no guard or tracing class in front) and still
  averages: rank-valued gradients over several pipeline pieces of the
  default one average to the closed form, equal to the layered
  communicator's result, and ``bcast_data`` copies rank 0's parameters;
- ``create_communicator`` applies the guards by default: ranks that call
  different collectives all raise CollectiveMismatchError.
"""
import os

import numpy

import minichain
from minichain import dist
from minichain.dist.guards import watchdog
from minichain.dist.guards.guarded import Guarded
from minichain.dist.trace.traced import Traced
from minichain.dist.transports.pipeline import PIPELINE_BYTES
from minichain.dist.wire import Wire


class Grads(minichain.Link):
    """Three float64 parameters, one longer than a pipeline piece."""

    def __init__(self, rank):
        super().__init__()
        sizes = (3, PIPELINE_BYTES // 8 + 5, 7)
        with self.init_scope():
            for i, n in enumerate(sizes):
                setattr(self, 'p{}'.format(i), minichain.Parameter(
                    numpy.full(n, float(rank), numpy.float64)))

    def set_grads(self, rank):
        for k, p in enumerate(self.params()):
            p.grad = numpy.arange(p.size, dtype=numpy.float64) + rank + k


def averaged(comm):
    model = Grads(comm.rank)
    model.set_grads(comm.rank)
    comm.multi_node_mean_grad(model)
    return [p.grad.copy() for p in model.params()]


def main():
    for name in ('flat', 'naive'):
        raw = dist.create_communicator(name, layers=())
        layered = dist.create_communicator(name)
        assert type(raw.wire) is Wire, raw.wire
        assert not isinstance(raw, (Guarded, Traced)), type(raw).__mro__
        assert isinstance(layered, (Guarded, Traced)), type(layered).__mro__
        assert isinstance(layered.wire, watchdog.Wire)
        assert type(raw).__name__ == type(layered).__name__
        size = raw.size
        got = averaged(raw)
        for k, g in enumerate(got):
            want = numpy.arange(g.size) + (size - 1) / 2 + k
            assert numpy.allclose(g, want, rtol=1e-12, atol=0), (name, k)
        for a, b in zip(got, averaged(layered)):
            assert numpy.array_equal(a, b), name
        model = Grads(raw.rank)
        raw.bcast_data(model)
        assert all((p.array == 0).all() for p in model.params())
        raw.finalize()
        layered.finalize()

    comm = dist.create_communicator('flat')
    x = numpy.ones(3)
    try:
        if comm.rank == 0:
            comm.allreduce(x)
        else:
            comm.bcast_obj('a different collective')
    except dist.CollectiveMismatchError as e:
        assert 'called different collectives' in str(e), e
    else:
        raise AssertionError('no CollectiveMismatchError')
    comm.finalize()
    # one write: print's pieces from two ranks can interleave
    os.write(1, 'LAYERS-OK rank {}\n'.format(comm.rank).encode())


if __name__ == '__main__':
    main()
