"""shard_state=True (minichain/dist/averaging/sharded.py) under real
``mpiexec -n K``: every check of workers/checks_shard.py on the flat and
the ring communicator, in one MPI job per K."""
import os
import sys
import traceback

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'workers'))

CHECKS = ('equivalence', 'equivalence_convnet', 'state_is_one_shard',
          'hooks_and_clipping', 'refusals', 'nan_named_everywhere',
          'snapshot_resumes', 'snapshot_reshards', 'layout_change')


@pytest.mark.mpi(ranks=[1, 2, 3, 4, 5], timeout=240)
def test_shard_state_checks(mpi_ranks):
    pytest.importorskip('mpi4py', reason='mpi4py is not installed '
                        '(pip install mpi4py mpich)')
    from minichain import dist
    import checks_shard
    failed = {}
    comms = [dist.create_communicator(name) for name in ('flat', 'ring')]
    for comm in comms:
        for name in CHECKS:
            if mpi_ranks == 1 and name != 'refusals':
                continue  # needs two ranks or more
            try:
                getattr(checks_shard, name)(comm)
                error = None
            except Exception:
                error = traceback.format_exc()
            errors = comms[0].mpi_comm.allgather(error)
            if any(errors):
                failed['{}:{}'.format(comm.name, name)] = '\n'.join(
                    'rank {}: {}'.format(r, e)
                    for r, e in enumerate(errors) if e)
    assert not failed, '{} checks failed on {} ranks:\n\n{}'.format(
        len(failed), mpi_ranks, '\n\n'.join(
            '{}: {}'.format(k, v) for k, v in failed.items()))


def test_every_check_exists():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'workers'))
    import checks_shard
    for name in CHECKS:
        assert callable(getattr(checks_shard, name))


@pytest.mark.mpi
@pytest.mark.parametrize('communicator', ['flat', 'ring'])
def test_the_watchdog_names_a_rank_missing_from_the_reduce_scatter(
        communicator):
    from tests.dist._launch import require_mpi, run_mpi
    require_mpi()
    res = run_mpi(3, 'shard_stall.py', communicator, timeout=150,
                  env={'MINICHAIN_STALL_TIMEOUT': '4'})
    assert not res.timed_out, res.output
    assert res.returncode != 0, res.output
    for words in ('watchdog', 'rank 1: no word from it', 'reduce_scatter #2',
                  '{} communicator over 3 ranks'.format(communicator),
                  'reduce-scatter 2 of rank 1: sleeping'):
        assert words in res.output, (words, res.output)
    assert 'all done' not in res.output, res.output
