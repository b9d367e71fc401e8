"""create_multi_node_evaluator and multi_node_snapshot under real mpiexec.

This file is also the worker: ``python test_extensions.py <mode> ...`` runs
one rank's part (pytest launches it with mpiexec).
"""
import os
import subprocess
import sys

import numpy
import pytest

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))


# -- the worker (one rank) ----------------------------------------------------
def _evaluator_worker():
    from minichain import dist, initializers
    from minichain import links as L
    from minichain.datasets import TupleDataset
    from minichain.iterators import SerialIterator
    from minichain.training import extensions
    comm = dist.create_communicator('flat')
    for n in (11, 2):  # 2 examples over 3 ranks: one shard is empty
        rng = numpy.random.default_rng(n)
        x = rng.standard_normal((n, 5)).astype(numpy.float32)
        t = rng.integers(0, 3, n).astype(numpy.int32)
        initializers.set_random_seed(0)
        model = L.Classifier(L.Linear(5, 3))

        def evaluator(columns):
            it = SerialIterator(TupleDataset(*columns), 4, repeat=False,
                                shuffle=False)
            return extensions.Evaluator(it, model)
        full = evaluator((x, t)).evaluate()
        shard = dist.scatter_dataset((x, t) if comm.rank == 0 else None,
                                     comm, force_equal_length=False)
        ev = dist.create_multi_node_evaluator(evaluator(shard), comm)
        got = ev.evaluate()
        assert isinstance(ev, extensions.Evaluator)
        assert sorted(got) == sorted(full), (got, full)
        for k in full:
            numpy.testing.assert_allclose(got[k], float(full[k]), rtol=1e-6,
                                          err_msg=k)
        # Negative control: the unweighted mean of the ranks' means differs.
        local = (evaluator(shard).evaluate() if len(shard[0]) else None)
        means = [m for m in comm.allgather_obj(
            local and float(local['validation/main/loss'])) if m is not None]
        naive = sum(means) / len(means)
        if n == 11:  # unequal shards
            assert abs(naive - float(full['validation/main/loss'])) > 1e-4
        print('rank {} n={} shard={} equal'.format(comm.rank, n,
                                                   len(shard[0])), flush=True)


def _snapshot_trainer(comm, out, savefun=None, shard_state=False):
    import minichain
    from minichain import dist, initializers, optimizers, training
    from minichain import functions as F
    from minichain import links as L
    from minichain.datasets import TupleDataset
    from minichain.iterators import SerialIterator
    from minichain.training import extensions

    class Net(minichain.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.l1 = L.Linear(4, 6)
                self.bn = L.BatchNormalization(6)  # per-rank statistics
                self.l2 = L.Linear(6, 3)

        def forward(self, x):
            return self.l2(F.relu(self.bn(self.l1(x))))
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((24, 4)).astype(numpy.float32)
    t = rng.integers(0, 3, 24).astype(numpy.int32)
    shard = dist.scatter_dataset((x, t) if comm.rank == 0 else None, comm,
                                 shuffle=True, seed=0)
    initializers.set_random_seed(0)
    model = L.Classifier(Net())
    opt = dist.create_multi_node_optimizer(
        optimizers.MomentumSGD(lr=0.1), comm,
        shard_state=shard_state).setup(model)
    it = SerialIterator(TupleDataset(*shard), 2, seed=0)
    trainer = training.Trainer(training.StandardUpdater(it, opt),
                               (6, 'iteration'), out=out)
    snap = dist.multi_node_snapshot(comm, extensions.snapshot(
        filename='snap_{.updater.iteration}', savefun=savefun))
    trainer.extend(snap, trigger=(3, 'iteration'))
    if comm.rank == 0:  # an extension only the root has
        trainer.extend(extensions.LogReport(trigger=(1, 'iteration')))
    return trainer, snap, model


def _full_disk(path, obj):
    """Writes the first snapshot, then finds the disk full."""
    import errno
    from minichain import serializers
    if os.path.exists(os.path.join(os.path.dirname(path), 'snap_3')):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    serializers.save_npz(path, obj)


def _snapshot_worker(mode, out):
    from minichain import dist, serializers
    comm = dist.create_communicator('flat')
    shard = mode.endswith('-shard')  # shard_state=True
    mode = mode.replace('-shard', '')
    trainer, snap, model = _snapshot_trainer(
        comm, out, _full_disk if mode == 'full' else None, shard)
    if mode == 'full':
        try:
            trainer.run()
        except OSError as e:
            print('rank {} stopped: {}'.format(comm.rank, e), flush=True)
        return
    final = os.path.join(out, 'final_rank{}.npz'.format(comm.rank))
    if mode == 'save':
        trainer.run()
        serializers.save_npz(final, model)
        print('rank {} saved'.format(comm.rank), flush=True)
        return
    try:
        snap.load(os.path.join(out, 'snap_3'), trainer)
    except ValueError as e:
        print('rank {} refused: {}'.format(comm.rank, e), flush=True)
        return
    assert trainer.updater.iteration == 3
    trainer.run()
    with numpy.load(final) as expected:
        saved = serializers.DictionarySerializer()
        saved.save(model)
        assert sorted(saved.target) == sorted(expected.files)
        for k in expected.files:
            numpy.testing.assert_array_equal(saved.target[k], expected[k],
                                             err_msg=k)
    print('rank {} resumed equal'.format(comm.rank), flush=True)


# -- the tests ----------------------------------------------------------------
def _run(n, *args, timeout=60):
    from tests.dist._launch import mpi_command
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    env.pop('MINICHAIN_NO_ABORT', None)
    proc = subprocess.run(mpi_command(n, sys.executable, HERE, *args),
                          capture_output=True, text=True, timeout=timeout,
                          env=env)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.mpi
@pytest.mark.parametrize('n', [2, 3])
def test_multi_node_evaluator_equals_single_process(n):
    rc, out = _run(n, 'evaluator')
    assert rc == 0, out
    for rank in range(n):
        assert 'rank {} n=11'.format(rank) in out, out
    if n == 3:
        assert 'rank 2 n=2 shard=0 equal' in out, out


@pytest.mark.mpi
def test_multi_node_snapshot_resumes_and_refuses_other_sizes(tmp_path):
    rc, out = _run(2, 'save', tmp_path)
    assert rc == 0, out
    assert (tmp_path / 'snap_3').exists() and (tmp_path / 'snap_6').exists()
    with numpy.load(tmp_path / 'snap_3') as npz:
        assert int(npz['extensions/multi_node_snapshot/world_size']) == 2
        assert any(k.startswith('extensions/multi_node_snapshot/rank1/')
                   for k in npz.files)
    rc, out = _run(2, 'resume', tmp_path)
    assert rc == 0 and out.count('resumed equal') == 2, out
    for n in (1, 3):
        rc, out = _run(n, 'resume', tmp_path)
        assert rc == 0, out
        assert out.count('refused') == n, out
        assert 'written by a run with 2 processes, but this run has {}' \
            .format(n) in out, out


@pytest.mark.mpi
def test_multi_node_snapshot_of_a_sharded_state(tmp_path):
    # written whole (the velocity of every parameter, full shape), and
    # resumed bit-exactly: each rank takes its shard back
    rc, out = _run(2, 'save-shard', tmp_path)
    assert rc == 0, out
    with numpy.load(tmp_path / 'snap_3') as npz:
        v = npz['updater/optimizer:main/predictor/l1/W/v']
        assert v.shape == (6, 4) and (v != 0).all(), v
    rc, out = _run(2, 'resume-shard', tmp_path)
    assert rc == 0 and out.count('resumed equal') == 2, out


@pytest.mark.mpi
def test_a_snapshot_root_cannot_write_stops_every_rank(tmp_path):
    rc, out = _run(2, 'full', tmp_path)
    assert rc == 0, out
    for rank in (0, 1):
        assert ('rank {} stopped: multi_node_snapshot: rank 0 could not write '
                'the snapshot of iteration 6: [Errno 28] No space left'
                .format(rank)) in out, out
    assert sorted(os.listdir(str(tmp_path))) == ['log', 'snap_3']  # no temp


if __name__ == '__main__':
    if sys.argv[1] == 'evaluator':
        _evaluator_worker()
    else:
        _snapshot_worker(sys.argv[1], sys.argv[2])
