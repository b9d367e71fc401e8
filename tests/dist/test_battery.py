"""Every CPU communicator under real ``mpiexec -n K`` for K = 1, 2, 3, 4.

Marked ``mpi(ranks=...)``, the test runs as one MPI job per K (minichain's
pytest plugin launches it); each job runs every check of workers/battery.py
in order, and a failure lists each failed check with the traceback of every
rank it failed on.
"""
import pytest

from tests.dist.workers.battery import CHECKS, OVERLAP_CHECKS, run_checks


@pytest.mark.mpi(ranks=[1, 2, 3, 4], timeout=150)
def test_every_check_passes_on_every_rank(mpi_ranks):
    pytest.importorskip('mpi4py', reason='mpi4py is not installed '
                        '(pip install mpi4py mpich)')
    failed = run_checks()
    assert not failed, '{} of {} checks failed on {} ranks:\n\n{}'.format(
        len(failed), len(CHECKS), mpi_ranks, '\n\n'.join(
            '{}: {}'.format(name, text) for name, text in failed.items()))


def test_every_check_exists():
    from tests.dist.workers import checks_generic, checks_model, checks_overlap
    for name in CHECKS:
        module = (checks_model if ':' in name else checks_overlap
                  if name in OVERLAP_CHECKS else checks_generic)
        assert callable(getattr(module, name.split(':')[-1]))
