"""ChainerMN's names and module paths under minichain.dist."""
import subprocess
import sys

import pytest

from minichain import dist
from tests.dist._launch import require_mpi, run_mpi


@pytest.mark.mpi
def test_allreduce_grad_is_multi_node_mean_grad():
    require_mpi()
    res = run_mpi(2, 'allreduce_grad.py', 'naive', 'flat', timeout=60)
    assert res.returncode == 0, res.output
    for rank in (0, 1):
        for name in ('naive', 'flat'):
            assert 'rank {} {}: ok'.format(rank, name) in res.output


def test_links_and_extensions_paths():
    from minichain.dist import extensions, links
    assert dist.links is links and dist.extensions is extensions
    assert links.MultiNodeBatchNormalization is \
        dist.MultiNodeBatchNormalization
    assert links.create_mnbn_model is dist.create_mnbn_model
    assert extensions.multi_node_snapshot is dist.multi_node_snapshot
    assert extensions.create_multi_node_evaluator is \
        dist.create_multi_node_evaluator
    assert {'links', 'extensions', 'functions'} <= set(dir(dist))
    assert links.MultiNodeChainList is dist.MultiNodeChainList
    from minichain.dist import functions
    assert dist.functions is functions
    for name in ('send', 'recv', 'pseudo_connect', 'bcast', 'gather',
                 'scatter', 'allgather', 'alltoall'):
        assert callable(getattr(functions, name)), name
    with pytest.raises(AttributeError, match='no attribute'):
        dist.no_such_thing


def test_paths_import_no_mpi4py():
    code = ('import sys; from minichain import dist; dist.links.'
            'MultiNodeBatchNormalization; dist.extensions.multi_node_snapshot;'
            ' import minichain.dist.communicators.naive_communicator; '
            'import minichain.dist.iterators, minichain.dist.nccl; '
            'dist.extensions.ObservationAggregator; dist.functions.send; '
            'print("mpi4py" in sys.modules or "cupy" in sys.modules)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'False'
