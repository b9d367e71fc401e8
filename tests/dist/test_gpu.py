"""GPU communicators under mpiexec; the GPU ones are skipped where no CUDA
GPU is present."""
import pytest

from minichain import backend, device
from tests.dist._launch import require_mpi, run_mpi

pytestmark = [pytest.mark.mpi]
needs_gpu = pytest.mark.skipif(not backend.gpu_available(),
                               reason='no CUDA GPU')


@pytest.mark.parametrize('n', [1, 2])
def test_auto_says_once_on_rank_0_why_it_is_not_nccl(n):
    require_mpi()
    res = run_mpi(n, 'gpu.py', 'auto', timeout=300)
    assert not res.timed_out and res.returncode == 0, res.output
    if 'AUTO-NCCL' in res.output:
        pytest.skip('NCCL is usable here')
    assert all("AUTO-OK {}".format(r) in res.output for r in range(n)), \
        res.output
    lines = [ln for ln in res.output.splitlines() if 'chose' in ln]
    prefix = ("minichain.dist: create_communicator('auto') chose 'flat', "
              "not 'pure_nccl': ")
    why = _why()
    if why:
        assert lines == [prefix + why], res.output
    else:  # NCCL works here, but the ranks would share this node's GPUs
        assert len(lines) == 1 and lines[0].startswith(prefix), res.output
        assert 'would share one GPU' in lines[0], res.output


def _why():
    from minichain.dist import _why_not_nccl
    return _why_not_nccl()


@pytest.mark.gpu
@needs_gpu
def test_pure_nccl_single_rank_gpu_checks():
    require_mpi()
    res = run_mpi(1, 'gpu.py', 'single', timeout=300)
    print(res.output)  # for bench/gpu_check.sh's log (pytest -s)
    assert not res.timed_out and res.returncode == 0, res.output
    assert 'GPU-OK 0' in res.output


@pytest.mark.gpu
@needs_gpu
def test_overlap_on_the_gpu_equals_averaging_after_backward():
    require_mpi()
    res = run_mpi(1, 'gpu.py', 'overlap', timeout=300)
    print(res.output)
    assert not res.timed_out and res.returncode == 0, res.output
    assert 'OVERLAP-OK 0' in res.output


@pytest.mark.gpu
@needs_gpu
@pytest.mark.skipif(device.visible_gpu_count() < 2, reason='needs 2 GPUs')
def test_two_ranks_bfloat16_overlap_equals_the_true_mean():
    require_mpi()
    res = run_mpi(2, 'gpu.py', 'overlap2', timeout=300)
    print(res.output)
    assert not res.timed_out and res.returncode == 0, res.output
    assert 'OVERLAP2-OK 0' in res.output and 'OVERLAP2-OK 1' in res.output


@pytest.mark.gpu
@needs_gpu
def test_two_ranks_on_one_gpu_is_a_clear_error_on_every_rank():
    require_mpi()
    res = run_mpi(2, 'gpu.py', 'shared', timeout=300,
                  env={'CUDA_VISIBLE_DEVICES': '0'})
    assert not res.timed_out and res.returncode == 0, res.output
    assert 'SHARED-OK 0' in res.output and 'SHARED-OK 1' in res.output


@pytest.mark.gpu
@needs_gpu
def test_nccl_is_torn_down_at_exit_without_finalize():
    require_mpi()
    res = run_mpi(1, 'gpu.py', 'exit', timeout=300)
    assert not res.timed_out and res.returncode == 0, res.output
    assert 'EXIT-OK' in res.output and 'Traceback' not in res.output
    assert 'teardown at exit failed' not in res.output
