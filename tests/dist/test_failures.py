"""Failures end the whole MPI job quickly instead of hanging it."""
import pytest

from tests.dist._launch import require_mpi, run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize('name', ['naive', 'flat'])
def test_model_mismatch_same_error_everywhere_and_job_ends(name, tmp_path):
    require_mpi()
    res = run_mpi(3, 'mismatch.py', tmp_path, name, timeout=60)
    assert not res.timed_out, res.output
    assert res.returncode != 0, res.output
    texts = [(tmp_path / 'rank{}.txt'.format(r)).read_text() for r in range(3)]
    assert texts[0] == texts[1] == texts[2]
    for part in ('bcast_data', 'differs between ranks', '/0/W', '/1/W',
                 '(4, 3) float32', '(5, 3) float32', 'ranks 0, 2', 'rank 1'):
        assert part in texts[0], texts[0]
    assert 'ModelMismatchError' in res.output
    assert 'no error' not in res.output


@pytest.mark.mpi
def test_exception_on_one_rank_aborts_the_job_within_seconds():
    require_mpi()
    res = run_mpi(2, 'crash.py', timeout=60)
    assert not res.timed_out, res.output
    assert res.returncode != 0
    assert res.elapsed < 20, res.elapsed
    assert '[rank 1] RuntimeError: boom on rank 1' in res.output, res.output
    assert '[rank 1] Traceback' in res.output
    assert 'passed the collective' not in res.output


@pytest.mark.mpi
def test_abort_hook_can_be_turned_off():
    # Without the hook (and without the watchdog) the survivor waits forever
    # in its collective: the very hang they prevent (cut short here).
    require_mpi()
    res = run_mpi(2, 'crash.py', timeout=8, env={
        'MINICHAIN_NO_ABORT': '1', 'MINICHAIN_STALL_TIMEOUT': '0'})
    assert res.timed_out, res.output
    assert 'RuntimeError: boom on rank 1' in res.output, res.output
    assert '[rank 1]' not in res.output


@pytest.mark.mpi
def test_without_the_hook_the_watchdog_sees_the_rank_leave():
    require_mpi()
    res = run_mpi(2, 'crash.py', timeout=60, env={
        'MINICHAIN_NO_ABORT': '1', 'MINICHAIN_STALL_TIMEOUT': '60'})
    assert not res.timed_out and res.returncode != 0, res.output
    assert res.elapsed < 40, res.elapsed  # seconds, not the stall timeout
    assert 'RuntimeError: boom on rank 1' in res.output, res.output
    assert ('rank 1: left (an uncaught RuntimeError) before any collective'
            in res.output), res.output


@pytest.mark.mpi
def test_a_worker_rerunning_a_script_without_main_guard_says_so():
    # Each worker re-imports the main module; it used to start MPI there
    # (MPICH: 'PMI_Init returned -1') and die with no word of the guard.
    require_mpi()
    res = run_mpi(2, 'no_main_guard.py', timeout=60)
    assert not res.timed_out and res.returncode != 0, res.output
    assert ("minichain.dist: error: MPI started again in a multiprocessing "
            "child" in res.output), res.output
    assert "under if __name__ == '__main__':" in res.output
    assert 'exited with status 1 before reading any example' in res.output
    assert 'PMI_Init' not in res.output and 'read (' not in res.output
