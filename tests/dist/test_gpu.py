"""GPU communicators under mpiexec; skipped where no CUDA GPU is present."""
import pytest

from minichain import backend
from tests.dist._launch import require_mpi, run_mpi

pytestmark = [
    pytest.mark.gpu, pytest.mark.mpi,
    pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU'),
]


def test_pure_nccl_single_rank_gpu_checks():
    require_mpi()
    res = run_mpi(1, 'gpu.py', 'single', timeout=300)
    assert not res.timed_out and res.returncode == 0, res.output
    assert 'GPU-OK 0' in res.output


def test_two_ranks_on_one_gpu_is_a_clear_error_on_every_rank():
    require_mpi()
    res = run_mpi(2, 'gpu.py', 'shared', timeout=300,
                  env={'CUDA_VISIBLE_DEVICES': '0'})
    assert not res.timed_out and res.returncode == 0, res.output
    assert 'SHARED-OK 0' in res.output and 'SHARED-OK 1' in res.output
