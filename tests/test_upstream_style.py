"""Scripts in the shape of Chainer's and ChainerMN's examples, run as a
Chainer user runs them (tests/upstream_style/ says which is which).

They name minichain in their import lines only; the MNIST ones train on a
few hundred generated 28x28 images (class k: row k is bright) placed where
``get_mnist`` looks, ``$MINICHAIN_DATASET_ROOT/mnist``.
"""
import json
import os
import re

import numpy
import pytest

import minichain
from minichain import links as L
from models.resnet import ResNet50 as ReferenceResNet50
from tests.dist._launch import require_mpi, run_mpi
from tests.models.test_train_mnist import run, write_idx
from tests.upstream_style import resnet50

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                    'upstream_style')
SCRIPTS = sorted(n for n in os.listdir(HERE) if n.endswith('.py')
                 and not n.startswith('_'))
SMALL = ['--unit', 16, '--batchsize', 20]


@pytest.fixture(scope='module')
def dataset_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('datasets')
    folder = root / 'mnist'
    folder.mkdir()
    rng = numpy.random.default_rng(0)
    for split, n in (('train', 240), ('t10k', 101)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, 28, 28))
        images[numpy.arange(n), labels, :] += 180
        write_idx(str(folder / (split + '-images-idx3-ubyte')), images)
        write_idx(str(folder / (split + '-labels-idx1-ubyte')), labels)
    return {'MINICHAIN_DATASET_ROOT': str(root)}


def read_log(out):
    """LogReport's entries, and their (epoch, iteration) pairs."""
    with open(os.path.join(str(out), 'log')) as f:
        log = json.load(f)
    return [(e['epoch'], e['iteration']) for e in log], log


def snapshots(out):
    return sorted(p.name for p in out.glob('snapshot_*'))


@pytest.mark.parametrize('name', SCRIPTS)
def test_only_import_lines_name_minichain(name):
    with open(os.path.join(HERE, name)) as f:
        lines = f.read().splitlines()
    mentions = [line for line in lines if 'minichain' in line
                and not line.startswith('"""')]
    assert mentions, name
    for line in mentions:
        assert re.match(r'(import|from) minichain[ .]', line), line


def test_chainer_mnist_example(dataset_root, tmp_path):
    script = os.path.join(HERE, 'train_mnist.py')
    out = tmp_path / 'out'
    code, output = run([script, '--epoch', 2, '--frequency', 1, '--out', out]
                       + SMALL, env=dataset_root)
    assert code == 0, output
    # call_before_training: epoch 0 is logged and printed before training.
    epochs, log = read_log(out)
    assert epochs == [(0, 0), (1, 12), (2, 24)]
    assert 'main/loss' not in log[0] and 'validation/main/loss' in log[0]
    # Chance is 0.1. The example shuffles without a seed, as Chainer's
    # does, so the accuracy after its 24 iterations varies from run to
    # run: 0.45-0.57 in six runs, 0.297 once in a full suite.
    assert log[-1]['validation/main/accuracy'] > 0.2
    assert re.search(r'^0 +[0-9.]+ +[0-9.]+ +[0-9.]+$', output, re.M), output
    assert (out / 'loss.png').stat().st_size > 0
    assert (out / 'accuracy.png').stat().st_size > 0
    assert 'digraph' in (out / 'cg.dot').read_text()
    assert snapshots(out) == ['snapshot_iter_24']  # n_retains=1

    # --autoload: a rerun goes on from the newest snapshot in --out.
    code, output = run([script, '--epoch', 3, '--frequency', 1, '--out', out,
                        '--autoload'] + SMALL, env=dataset_root)
    assert code == 0, output
    epochs, _ = read_log(out)
    assert epochs == [(0, 0), (1, 12), (2, 24), (3, 36)]
    assert snapshots(out) == ['snapshot_iter_36']

    # --resume FILE into another folder.
    other = tmp_path / 'other'
    code, output = run([script, '--epoch', 4, '--out', other, '--resume',
                        out / 'snapshot_iter_36'] + SMALL, env=dataset_root)
    assert code == 0, output
    epochs, _ = read_log(other)
    assert epochs == [(0, 0), (1, 12), (2, 24), (3, 36), (4, 48)]
    assert snapshots(other) == ['snapshot_iter_48']


def test_chainer_mnist_example_without_data_says_where_to_put_it(tmp_path):
    code, output = run([os.path.join(HERE, 'train_mnist.py'), '--out',
                        tmp_path / 'out'],
                       env={'MINICHAIN_DATASET_ROOT': str(tmp_path)})
    assert code != 0
    assert 'FileNotFoundError: get_mnist: the MNIST IDX files' in output
    assert 'Put the four files in ' + str(tmp_path / 'mnist') in output


@pytest.mark.mpi
def test_chainermn_mnist_example_resumes_every_rank(dataset_root, tmp_path):
    require_mpi()
    script = os.path.join(HERE, 'train_mnist_data_parallel.py')
    first, second = tmp_path / 'first', tmp_path / 'second'
    res = run_mpi(2, script, '--epoch', 1, '--out', first, *SMALL,
                  env=dataset_root, timeout=120)
    assert res.returncode == 0, res.output
    assert res.output.count('Num process (COMM_WORLD): 2') == 1
    epochs, log = read_log(first)
    assert epochs == [(1, 6)]  # 120 examples a rank, 20 a batch
    assert 0 <= log[0]['validation/main/accuracy'] <= 1
    assert snapshots(first) == ['snapshot_iter_6']
    # Rank 1 has no LogReport, PrintReport...: it loads rank 0's snapshot
    # all the same, and both ranks go on from iteration 6.
    res = run_mpi(2, script, '--epoch', 2, '--out', second, '--resume',
                  first / 'snapshot_iter_6', *SMALL, env=dataset_root,
                  timeout=120)
    assert res.returncode == 0, res.output
    epochs, _ = read_log(second)
    assert epochs == [(1, 6), (2, 12)]
    assert snapshots(second) == ['snapshot_iter_12']


# Validation accuracy after 3 epochs at SMALL (chance: 0.1): the model-
# parallel example 0.762 (its order is fixed: shuffle=False), the dual-
# parallel one 0.755-0.863 in three runs; the data-parallel example above
# reaches 0.36-0.37 in its 3 epochs (18 steps against 36).
LEARNED = 0.5


@pytest.mark.mpi
@pytest.mark.parametrize('script, ranks, steps', [
    ('train_mnist_model_parallel.py', 2, 12),   # 240 examples, 20 a batch
    ('train_mnist_dual_parallel.py', 4, 6)])    # a half each: 120
def test_chainermn_model_parallel_examples_learn(dataset_root, tmp_path,
                                                 script, ranks, steps):
    require_mpi()
    out = tmp_path / 'out'
    res = run_mpi(ranks, os.path.join(HERE, script), '--epoch', 3, '--out',
                  out, *SMALL, env=dataset_root, timeout=180)
    assert res.returncode == 0, res.output
    epochs, log = read_log(out)
    assert epochs == [(1, steps), (2, 2 * steps), (3, 3 * steps)]
    assert log[-1]['validation/main/accuracy'] > LEARNED, log
    assert log[-1]['main/loss'] < log[0]['main/loss'], log
    # rank 0's graph runs through the messages to rank 1 and back
    dot = (out / 'cg.dot').read_text()
    assert 'Send (to rank 1)' in dot and 'Recv (from rank 1)' in dot


@pytest.mark.slow
def test_chainermn_resnet50_model_trains_a_step():
    model = resnet50.ResNet50()
    # The reference's count, plus conv1's bias (it has one here).
    assert sum(p.size for p in model.params()) == \
        ReferenceResNet50(1000).count_params() + 64
    optimizer = minichain.optimizers.MomentumSGD(lr=0.01).setup(model)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 3, model.insize, model.insize),
                            dtype=numpy.float32)
    t = numpy.array([3, 7], numpy.int32)
    before = model.fc.W.array.copy()
    reporter = minichain.Reporter()
    reporter.add_observer('main', model)
    observation = {}
    with reporter.scope(observation):
        optimizer.update(model, x, t)
    assert numpy.isfinite(float(observation['main/loss']))
    assert 0 <= float(observation['main/accuracy']) <= 1
    assert not numpy.array_equal(model.fc.W.array, before)
    assert isinstance(model.res2, minichain.ChainList)
    assert isinstance(model.res2[0].conv1, L.Convolution2D)
    assert [len(b) for b in (model.res2, model.res3, model.res4,
                             model.res5)] == [3, 4, 6, 3]
