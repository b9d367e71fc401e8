"""Lower precision under data parallelism: bfloat16 compute compared with
one process (the equivalence API's bfloat16 tolerance)."""
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
