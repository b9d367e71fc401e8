"""Lower precision under data parallelism: bfloat16 compute compared with
one process (the equivalence API's bfloat16 tolerance)."""
import contextlib

import numpy
import pytest

import minichain
from minichain import dist, functions as F, links as L
from minichain.dist.testing import assert_data_parallel_equivalent


class _ConvNet(minichain.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(4, 16, 3, pad=1)
            self.bn = L.BatchNormalization(16)
            self.fc = L.Linear(16 * 36, 3)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))))


@pytest.mark.mpi(ranks=[2, 3])
def test_bf16_compute_trains_like_one_process_within_bf16_tolerance():
    comm = dist.create_communicator('flat')
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((12, 4, 6, 6)).astype(numpy.float32)
    t = numpy.arange(12, dtype=numpy.int32) % 3
    with minichain.using_config('fp32_math', 'bf16'):
        assert_data_parallel_equivalent(
            lambda: dist.create_mnbn_model(_ConvNet(), comm), x, t, comm,
            steps=3)
    # the negative control: per-rank batch statistics must still fail
    with minichain.using_config('fp32_math', 'bf16'):
        with pytest.raises(AssertionError, match='differs from one process'):
            assert_data_parallel_equivalent(_ConvNet, x, t, comm, steps=3)


@pytest.mark.mpi(ranks=[2, 3])
def test_an_overflow_on_one_rank_skips_the_step_and_halves_on_every_rank():
    # Rank 1's loss overflows at the third update: its inf travels in the
    # averaged gradient to every rank, so every rank skips that update and
    # halves its scale, with no collective more than a clean update's.
    from minichain import optimizers
    comm = dist.create_communicator('flat')
    model = L.Linear(3, 2)
    opt = dist.create_multi_node_optimizer(
        optimizers.MomentumSGD(lr=0.1), comm).setup(model)
    opt.loss_scaling(interval=10)
    opt.broadcast_params()
    collectives = []
    plain_collective = comm.collective

    def counted(kind):
        collectives.append(kind)
        return plain_collective(kind)
    comm.collective = counted
    x = numpy.random.default_rng(comm.rank).standard_normal(
        (4, 3)).astype(numpy.float32)

    def lossfun(overflow):
        loss = F.sum(model(x) ** 2)
        return loss * numpy.float32(numpy.inf) if overflow else loss
    counts, scales = [], []
    for step in range(5):
        before = [p.array.copy() for p in model.params()]
        del collectives[:]
        overflow = step == 2 and comm.rank == 1
        with pytest.warns(RuntimeWarning, match='skipped') if step == 2 \
                else contextlib.nullcontext():
            opt.update(lossfun, overflow)
        counts.append(len(collectives))
        scales.append(opt.loss_scale)
        moved = [not numpy.array_equal(b, p.array)
                 for b, p in zip(before, model.params())]
        assert all(moved) == (step != 2) and any(moved) == (step != 2)
    assert scales == [2.0, 4.0, 2.0, pytest.approx(2.0 * 2 ** 0.1),
                      pytest.approx(2.0 * 2 ** 0.2)]
    assert len(set(counts)) == 1, counts    # the skip costs no collective
    assert comm.allgather_obj(scales) == [scales] * comm.size
    params = comm.allgather_obj([p.array for p in model.params()])
    for other in params[1:]:
        for a, b in zip(params[0], other):
            numpy.testing.assert_array_equal(a, b)

