"""The rest of ChainerMN 7.8.1's public API, as its documentation says it
behaves, under real ``mpiexec``: communicator classes built from their
ChainerMN module paths (guarded), scatter_dataset of an empty dataset,
create_empty_dataset, the iterators, the extensions (ObservationAggregator,
MultiNodeEarlyStoppingTrigger, AllreducePersistent, the checkpointer,
GenericMultiNodeEvaluator, multi_node_snapshot with replica sets) and
testing.get_device.
"""
import os

import numpy
import pytest

import minichain
from minichain import iterators, training
from minichain import links as L
from minichain.training import extensions
from tests.training._util import make_trainer


def _comm(name='naive'):
    pytest.importorskip('mpi4py', reason='mpi4py is not installed '
                        '(pip install mpi4py mpich)')
    from minichain import dist
    return dist.create_communicator(name)


def _shared_folder(comm, tmp_path):
    """One folder for every rank (rank 0's tmp_path)."""
    return comm.bcast_obj(str(tmp_path) if comm.rank == 0 else None)


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_classes_at_chainermn_paths_are_guarded(mpi_ranks):
    from mpi4py import MPI
    from minichain import dist
    from minichain.dist.communicators import naive_communicator
    from minichain.dist.communicators.mpi_communicator_base import \
        MpiCommunicatorBase
    from minichain.dist.naive import NaiveCommunicator
    comm = naive_communicator.NaiveCommunicator(MPI.COMM_WORLD)
    assert isinstance(comm, NaiveCommunicator)
    assert isinstance(comm, MpiCommunicatorBase)
    assert comm.layers == dist.default_layers()
    # an error on the root alone is raised on every rank (built bare, the
    # other ranks waited for ever)
    with pytest.raises(TypeError, match='the dataset on rank 0 .the root. '
                       'is None'):
        dist.scatter_dataset(None, comm)
    # ChainerMN: an empty dataset gives every rank an empty shard
    for c in (comm, NaiveCommunicator()):
        assert list(dist.scatter_dataset([] if c.rank == 0 else None, c,
                                          shuffle=True)) == []
        assert len(dist.scatter_index(0, c)) == 0
    empty = dist.datasets.create_empty_dataset(numpy.arange(5))
    assert empty == [()] * 5
    assert len(dist.scatter_dataset(empty if comm.rank == 0 else None,
                                     comm)) == -(-5 // comm.size)
    model = L.Linear(2, 2)
    model.W.array[...] = comm.rank
    comm.broadcast_data(model)  # ChainerMN's older name
    assert (model.W.array == 0).all()


def test_get_device_and_nccl_names():
    from minichain.dist import nccl, testing
    assert testing.get_device() == minichain.get_device('@numpy')
    with pytest.raises(ValueError, match='no ChainerX'):
        testing.get_device(use_chainerx=True)
    assert nccl._available in (True, False)
    if not nccl._available:
        with pytest.raises(AttributeError, match='NCCL is not usable here'):
            nccl.NcclCommunicator


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_multi_node_iterator_gives_every_rank_the_masters_batches(mpi_ranks):
    from minichain.dist.iterators import create_multi_node_iterator
    comm = _comm()
    master = comm.size - 1
    data = [(numpy.full(2, i, numpy.float32), i) for i in range(7)]
    actual = (iterators.SerialIterator(data, 3, repeat=False, seed=1)
              if comm.rank == master else None)
    it = create_multi_node_iterator(actual, comm, rank_master=master)
    batches = [[int(t) for _, t in batch] for batch in it]
    assert comm.allgather_obj(batches) == [batches] * comm.size
    assert sorted(sum(batches, [])) == list(range(7))  # all, once
    assert it.epoch == 1 and it.is_new_epoch
    it.reset()
    assert it.epoch == 0 and len(next(it)) == 3


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_synchronized_iterator_shares_rank_0s_order(mpi_ranks):
    from minichain.dist.iterators import create_synchronized_iterator
    comm = _comm()
    it = iterators.SerialIterator(list(range(10)), 4, seed=comm.rank)
    it = create_synchronized_iterator(it, comm)
    assert it.seed == 0
    batches = [next(it) for _ in range(6)]  # across epochs
    assert comm.allgather_obj(batches) == [batches] * comm.size
    with pytest.raises(ValueError, match='has no seed to share'):
        create_synchronized_iterator(iter([]), comm)


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_observation_aggregator_and_early_stopping(mpi_ranks, tmp_path):
    from minichain.dist import extensions as mn
    comm = _comm()
    r = comm.rank
    trainer = make_trainer(tmp_path, stop=(6, 'epoch'))
    # each rank's loss is its own; the aggregate is the mean over every
    # rank and every iteration since the last combination
    seen = []

    @training.make_extension(trigger=(1, 'iteration'), priority=400)
    def report(trainer):
        trainer.observation['mine'] = float(r + trainer.updater.iteration)

    @training.make_extension(trigger=(1, 'iteration'), priority=100)
    def read(trainer):
        seen.append(trainer.observation.get('mean'))

    trainer.extend(report)
    trainer.extend(mn.ObservationAggregator(comm, 'mine', 'mean',
                                            comm_trigger=(2, 'iteration')))
    trainer.extend(read)
    trainer.run()
    ranks = (comm.size - 1) / 2
    assert seen[:4] == [None, 1.5 + ranks, None, 3.5 + ranks]

    # the loss that rank 0 reports worsens after epoch 2, the others' keep
    # improving; their mean worsens too: every rank stops at epoch 2 +
    # patience 2 = 4, together
    trainer = make_trainer(tmp_path / 'stop', stop=None)
    trigger = mn.MultiNodeEarlyStoppingTrigger(
        comm, monitor='fake', patience=2, check_trigger=(1, 'epoch'),
        max_trigger=(10, 'epoch'))
    trainer.stop_trigger = trigger

    @training.make_extension(trigger=(1, 'iteration'), priority=400)
    def fake(trainer):
        e = trainer.updater.epoch_detail
        worse = 10 * comm.size * max(0.0, e - 2) if r == 0 else 0.0
        trainer.observation['fake'] = 10.0 - e + worse
    trainer.extend(fake)
    trainer.run()
    assert comm.allgather_obj(trainer.updater.epoch) == [4] * comm.size
    assert trigger.get_training_length() == (10, 'epoch')


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_allreduce_persistent_averages_float_statistics(mpi_ranks):
    from minichain.dist.extensions import AllreducePersistent
    comm = _comm()
    bn = L.BatchNormalization(3)
    mean = bn.avg_mean
    bn.avg_mean[...] = comm.rank
    bn.N = comm.rank  # an int: left alone
    AllreducePersistent(bn, comm)()
    assert bn.avg_mean is mean  # in place
    numpy.testing.assert_allclose(bn.avg_mean, (comm.size - 1) / 2)
    assert bn.N == comm.rank


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_checkpointer_resumes_from_the_common_newest(mpi_ranks, tmp_path):
    from minichain.dist import create_multi_node_checkpointer
    comm = _comm()
    out = os.path.join(_shared_folder(comm, tmp_path), 'cp')
    with pytest.warns(DeprecationWarning, match='multi_node_snapshot'):
        cp = create_multi_node_checkpointer('run', comm, cp_interval=2,
                                            gc_interval=1, path=out)
    trainer = make_trainer(out, stop=(3, 'epoch'))
    trainer.extend(cp, trigger=(1, 'epoch'))
    trainer.run()  # finalize removes them: keep a copy of the state
    assert sorted(cp.files) == []
    trainer = make_trainer(out, stop=(3, 'epoch'))
    for i in (5, 10, 15):
        trainer.updater.iteration = i
        cp.save(trainer, i)
    assert cp.files == ['run.{}.10'.format(comm.rank),
                        'run.{}.15'.format(comm.rank)]
    if comm.rank == 1:  # rank 1 lost its newest one
        os.remove(os.path.join(out, 'run.1.15'))
    again = make_trainer(out, stop=(3, 'epoch'))
    opt = type('Opt', (), {'needs_broadcast': True})()
    cp2 = create_multi_node_checkpointer('run', comm, path=out)
    cp2.maybe_load(again, opt)
    assert again.updater.iteration == 10 and not opt.needs_broadcast
    assert 'avg=' in cp.get_stats()


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_checkpointer_keeps_its_files_when_training_fails(mpi_ranks,
                                                          tmp_path):
    from minichain.dist import create_multi_node_checkpointer
    comm = _comm()
    out = os.path.join(_shared_folder(comm, tmp_path), 'cp')
    with pytest.warns(DeprecationWarning, match='multi_node_snapshot'):
        cp = create_multi_node_checkpointer('run', comm, path=out)
    trainer = make_trainer(out, stop=(3, 'epoch'))
    trainer.extend(cp, trigger=(1, 'epoch'))

    def fail(trainer):
        if trainer.updater.epoch == 2:
            raise RuntimeError('the data went missing')
    trainer.extend(fail, trigger=(1, 'epoch'))
    with pytest.raises(RuntimeError, match='the data went missing'):
        trainer.run()  # finalize keeps them: the rerun resumes from them
    assert cp.files and all(os.path.exists(os.path.join(out, name))
                            for name in cp.files)


class _Sum(minichain.Link):
    def forward(self, x, t):
        return [int(v) for v in t]


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_generic_evaluator_aggregates_every_result_on_root(mpi_ranks):
    from minichain import dist
    comm = _comm()
    data = [(numpy.zeros(1, numpy.float32), i) for i in range(11)]
    shard = dist.scatter_dataset(data if comm.rank == 0 else None, comm,
                                 force_equal_length=False)

    class Evaluator(dist.extensions.GenericMultiNodeEvaluator):
        def aggregate(self, results):
            return sorted(sum(results, []))

    ev = Evaluator(comm, iterators.SerialIterator(shard, 2, repeat=False,
                                                  shuffle=False), _Sum(),
                   root=comm.size - 1)
    got = ev(None)
    assert got == (list(range(11)) if comm.rank == comm.size - 1 else None)
    assert ev(None) == got  # the iterator was reset


@pytest.mark.mpi(ranks=[3], timeout=120)
def test_multi_node_snapshot_with_replica_sets(mpi_ranks, tmp_path):
    from minichain.dist.extensions import multi_node_snapshot
    comm = _comm()
    out = os.path.join(_shared_folder(comm, tmp_path), 'snap')

    def trainer_with_snapshot(stop):
        trainer = make_trainer(out, stop=stop)
        if comm.rank == 0:  # only rank 0 logs: its trainer differs
            trainer.extend(extensions.LogReport())
        snap = multi_node_snapshot(comm, extensions.snapshot(
            autoload=True), [0])  # sets {0} and {1, 2}
        trainer.extend(snap, trigger=(1, 'epoch'))
        return trainer, snap

    trainer, snap = trainer_with_snapshot((2, 'epoch'))
    assert snap.master == (0 if comm.rank == 0 else 1)
    trainer.run()
    comm.bcast_obj(None)  # every file written
    assert sorted(os.listdir(out)) == [
        'log', 'snapshot_iter_10.0', 'snapshot_iter_10.1',
        'snapshot_iter_5.0', 'snapshot_iter_5.1']
    # a restart: each master loads its newest file, rank 2 gets rank 1's
    trainer, _ = trainer_with_snapshot((3, 'epoch'))
    trainer.run()
    assert trainer.updater.iteration == 15
    if comm.rank == 0:
        log = trainer.get_extension('LogReport').log
        assert [e['epoch'] for e in log] == [1, 2, 3]
    with pytest.raises(ValueError, match='at most once'):
        multi_node_snapshot(comm, extensions.snapshot(), [[0, 1], [1]])


def test_the_mean_of_no_values_yet_is_none_on_rank_0_too():
    # (it was a ZeroDivisionError on rank 0 alone: the others then waited)
    from minichain.dist.observation import _mean_of_all
    assert _mean_of_all([[], []]) is None
    assert _mean_of_all([[1.0], [2.0, 3.0]]) == 2.0
