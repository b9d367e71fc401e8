"""The shared-memory sum under mpiexec: ``shared_memory.py``.

Each rank prints ``SHM-OK rank R`` after checking that, with every rank on
this machine,
- the flat communicator sums a packed buffer of several pieces in the
  mapped file (the gradients end as views into it), and the means equal
  the closed form and the bare protocol's (MPI's Allreduce; bit for bit
  with two ranks, where a sum of two is the same in either order), in
  float32, in float64 and with a float32 transfer of float64 gradients;
- a gradient missing on one rank counts as zeros (``zero_fill``);
- a second model gets regions of its own: averaging it leaves the first
  model's gradients as they were;
- a buffer smaller than one piece, and the ring communicator, do not use
  the file;
- no file is left in the directory (it never has a name);
- when rank 0 cannot make the file, every rank falls back to MPI's
  Allreduce and still averages right.
"""
import os

import numpy

from minichain import dist
from minichain.dist.transports import shared_memory

import _models as M


class Grads(M.Flat):
    def set_grads(self, rank, skip=None):
        for k, p in enumerate(self.params()):
            p.grad = None if k == skip else (
                numpy.arange(p.size) % 97 + rank + k).astype(p.dtype)


def average(comm, sizes, dtype, skip=None, zero_fill=False):
    model = Grads(sizes, dtype)
    model.set_grads(comm.rank, skip)
    comm.multi_node_mean_grad(model, zero_fill=zero_fill)
    return model


def in_file(comm, model):
    regions = comm._regions.get(model)  # noqa: the test looks inside
    return regions is not None and all(
        regions.offset_of(p.grad.reshape(-1)) is not None
        for p in model.params())


def leftovers():
    return sorted(f for f in os.listdir(shared_memory._shm_dir())
                  if f.startswith('minichain_sum_'))


def main():
    comm = dist.create_communicator('flat')
    bare = dist.create_communicator('flat', layers=())
    rank, size = comm.rank, comm.size
    assert comm.shares_memory(), 'all ranks are on this machine'
    piece = comm.piece_bytes
    big = [3, 2 * piece // 4 + 11, piece // 8 + 1, 5]  # several pieces

    for dtype, transfer in (('float32', None), ('float64', None),
                            ('float64', 'float32')):
        c = dist.create_communicator('flat', allreduce_grad_dtype=transfer)
        b = dist.create_communicator('flat', layers=(),
                                     allreduce_grad_dtype=transfer)
        got, ref = average(c, big, dtype), average(b, big, dtype)
        if transfer is None:  # the gradients are views into the file
            assert in_file(c, got), dtype
        else:  # converted back from the file's float32
            assert c._regions[got].dtype == numpy.float32, transfer
        for k, (p, q) in enumerate(zip(got.params(), ref.params())):
            want = numpy.arange(p.size) % 97 + (size - 1) / 2 + k
            tol = 1e-6 if 'float32' in (dtype, transfer) else 1e-13
            assert p.grad.dtype == p.dtype, (p.grad.dtype, p.dtype)
            assert numpy.allclose(p.grad, want, rtol=tol, atol=0), (dtype, k)
            if size == 2:
                assert numpy.array_equal(p.grad, q.grad), (dtype, k)
        c.finalize()
        b.finalize()

    skip = 1 if rank == 0 else None
    m = average(comm, big, 'float32', skip=skip, zero_fill=True)
    g = list(m.params())[1].grad
    want = numpy.arange(g.size) % 97 + 1
    want = want * (size - 1) / size + sum(range(1, size)) / size
    assert numpy.allclose(g, want, rtol=1e-6), 'zero_fill'

    first = average(comm, big, 'float32')
    kept = [p.grad.copy() for p in first.params()]
    second = average(comm, big + [7], 'float32')
    assert in_file(comm, first) and in_file(comm, second)
    for p, k in zip(first.params(), kept):
        assert numpy.array_equal(p.grad, k), 'the second model wrote over it'

    small = average(comm, [3, 5], 'float32')
    assert not in_file(comm, small)
    ring = dist.create_communicator('ring')
    assert not ring.shares_memory()
    r = average(ring, big, 'float32')
    assert numpy.allclose(list(r.params())[0].grad,
                          numpy.arange(3) % 97 + (size - 1) / 2, rtol=1e-6)
    ring.finalize()

    comm.mpi_comm.Barrier()
    assert not leftovers(), leftovers()

    if rank == 0:  # rank 0 cannot make the file: MPI's Allreduce, all ranks
        shared_memory._shm_dir = lambda: '/nonexistent-minichain-dir'
    c = dist.create_communicator('flat')
    m = average(c, big, 'float32')
    assert not in_file(c, m) and 'rank 0 could not make' in str(
        shared_memory.why_not), shared_memory.why_not
    g = list(m.params())[0].grad
    assert numpy.allclose(g, numpy.arange(3) % 97 + (size - 1) / 2)
    c.finalize()
    comm.finalize()
    bare.finalize()
    print('SHM-OK rank {}'.format(rank), flush=True)


if __name__ == '__main__':
    main()
