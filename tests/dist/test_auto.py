"""create_communicator('auto'): NCCL only where every rank has a GPU of its
own (fake device counts and bus ids; no GPU needed)."""
import pytest

from minichain import device, dist

BUS = '0000:{:02x}:00.0'


def _fake_gpus(monkeypatch, visible, bus_of):
    monkeypatch.setattr(dist, '_why_not_nccl', lambda: '')
    monkeypatch.setattr(dist, '_auto_told', False)
    monkeypatch.setattr(device, 'visible_gpu_count', lambda: visible)
    monkeypatch.setattr(device, 'gpu_bus_id', bus_of)


@pytest.mark.mpi(ranks=[2, 3])
def test_auto_does_not_pick_nccl_when_ranks_share_a_gpu(monkeypatch, capfd):
    """The default `make train` (2 ranks) on a one-GPU machine: every rank
    would drive GPU 0, and NCCL would fail at the first averaging."""
    _fake_gpus(monkeypatch, 1, lambda i: BUS.format(i))
    comm = dist.create_communicator('auto')
    assert type(comm).__name__ == 'FlatCommunicator'
    err = capfd.readouterr().err
    if comm.rank == 0:
        assert "chose 'flat', not 'pure_nccl': ranks 0-" in err, err
        assert 'would share one GPU (bus 0000:00:00.0)' in err, err
    else:
        assert 'chose' not in err, err


@pytest.mark.mpi(ranks=[2])
def test_auto_picks_nccl_with_a_gpu_per_rank(monkeypatch):
    _fake_gpus(monkeypatch, 2, lambda i: BUS.format(i))
    assert type(dist.create_communicator('auto')).__name__ == \
        'PureNcclCommunicator'


@pytest.mark.mpi(ranks=[2])
def test_auto_picks_nccl_when_the_launcher_bound_a_gpu_per_rank(
        monkeypatch):
    """Each rank sees one GPU, its own, as device 0 (Slurm's
    --gpus-per-task): different buses, so NCCL."""
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.rank
    _fake_gpus(monkeypatch, 1, lambda i: BUS.format(10 + rank))
    assert type(dist.create_communicator('auto')).__name__ == \
        'PureNcclCommunicator'


# The tests run in this process come last: minichain's pytest plugin runs
# an mpi(ranks=...) test as a job and skips its setup and teardown here, so
# one that ends a module would leave the module's setup open for the next.
def test_the_same_reason_everywhere_is_said_once():
    answers = [('CuPy is not installed', 'n0', None)] * 3
    assert dist._auto_verdict(answers) == 'CuPy is not installed'


def test_a_reason_on_some_ranks_names_them():
    answers = [('', 'n0', BUS.format(0)), ('no NCCL', 'n0', None),
               ('no NCCL', 'n1', None)]
    assert dist._auto_verdict(answers) == 'ranks 1-2: no NCCL'


@pytest.mark.parametrize('buses,shared', [
    ([('n0', 0), ('n0', 1), ('n1', 0), ('n1', 1)], None),
    ([('n0', 0), ('n0', 0)], 'ranks 0-1 would share one GPU (bus '
     '0000:00:00.0) on node n0'),
    ([('n0', 0), ('n0', 1), ('n0', 0)], 'ranks 0, 2 would share'),
])
def test_ranks_that_would_share_a_gpu_are_named(buses, shared):
    answers = [('', node, BUS.format(b)) for node, b in buses]
    why = dist._auto_verdict(answers)
    if shared is None:
        assert why == ''
    else:
        assert why.startswith(shared) and 'NCCL needs a GPU per rank' in why
