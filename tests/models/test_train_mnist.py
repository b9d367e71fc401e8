"""models/train_mnist.py and the script of docs/porting.md, run for real.

Each run trains a small MLP for an epoch or two on generated Fashion-MNIST
IDX files (a few hundred 28x28 images whose class is a bright row, so that
the model can learn it), in a subprocess: one process, or ``mpiexec -n 2``.
"""
import difflib
import gzip
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time

import numpy
import pytest

import minichain
from minichain import backend, serializers
from minichain.iterators import SerialIterator
from minichain.training import extensions
from tests.dist._launch import mpi_command, require_mpi
from tests.models._snapshots import assert_same_model, snapshots
from tests.test_docs import read_page

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
SCRIPT = os.path.join(ROOT, 'models', 'train_mnist.py')
PAGE = os.path.join(ROOT, 'docs', 'porting.md')
N_TRAIN, N_TEST = 240, 101  # 101: the two ranks' test shards differ
SMALL = ['--unit', '16', '--batchsize', '20']


def write_idx(path, array):
    """Write a uint8 array as a gzipped IDX file ``path + '.gz'``."""
    header = struct.pack('>BBBB', 0, 0, 0x08, array.ndim)
    header += struct.pack('>{}I'.format(array.ndim), *array.shape)
    with gzip.open(path + '.gz', 'wb') as f:
        f.write(header + array.astype(numpy.uint8).tobytes())


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    """A folder with the four Fashion-MNIST files, generated."""
    folder = tmp_path_factory.mktemp('fashion-mnist')
    rng = numpy.random.default_rng(0)
    for split, n in (('train', N_TRAIN), ('t10k', N_TEST)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 60, (n, 28, 28))
        images[numpy.arange(n), labels, :] += 180  # class k: row k is bright
        write_idx(str(folder / (split + '-images-idx3-ubyte')), images)
        write_idx(str(folder / (split + '-labels-idx1-ubyte')), labels)
    return str(folder)


def run(args, nprocs=0, env=None, timeout=60):
    """Run ``python args`` (under ``mpiexec -n nprocs`` if nprocs); returns
    (exit code, stdout + stderr). A hang kills the process group and
    fails the test."""
    cmd = [sys.executable] + [str(a) for a in args]
    if nprocs:
        cmd = mpi_command(nprocs, *cmd)
    full_env = dict(os.environ, OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1',
                    PYTHONUNBUFFERED='1')
    full_env.pop('MINICHAIN_NO_ABORT', None)
    full_env.update(env or {})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=full_env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail('{} hung for {} s; output:\n{}'.format(
            ' '.join(cmd), timeout, out.decode(errors='replace')))
    return proc.returncode, out.decode(errors='replace')


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log')) as f:
        return json.load(f)


def evaluate_snapshot(path, data_dir):
    """Validation means of a snapshot's model over the whole test set, in
    this one process."""
    from models.train_mnist import MLP
    model = minichain.links.Classifier(MLP(16, 10))
    serializers.load_npz(path, model, path='updater/model:main/',
                         strict=False)
    _, test = minichain.datasets.get_fashion_mnist(data_dir=data_dir)
    evaluator = extensions.Evaluator(
        SerialIterator(test, 20, repeat=False, shuffle=False), model)
    return evaluator.evaluate()


@pytest.mark.mpi
def test_two_ranks(data_dir, tmp_path):
    require_mpi()
    out = tmp_path / 'out'
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 2,
                        '--out', out] + SMALL, nprocs=2)
    assert code == 0, output
    assert output.count('validation/main/accuracy') == 1  # rank 0 reports
    assert 'digraph' in (out / 'cg.dot').read_text()
    log = read_log(out)
    assert [e['epoch'] for e in log] == [1, 2]
    # 120 images per rank, 20 per batch: 6 iterations an epoch.
    assert [e['iteration'] for e in log] == [6, 12]
    for entry in log:
        for key in ('main/loss', 'main/accuracy', 'validation/main/loss',
                    'validation/main/accuracy'):
            assert numpy.isfinite(entry[key]), (key, entry)
    assert log[-1]['validation/main/accuracy'] > 0.3  # chance is 0.1
    assert log[-1]['main/loss'] < log[0]['main/loss']
    # The multi-node evaluator (shards of 51 and 50 examples) reports what
    # one process gets on the whole test set with the same weights.
    whole = evaluate_snapshot(str(out / 'snapshot_epoch_2'), data_dir)
    for key in ('validation/main/loss', 'validation/main/accuracy'):
        numpy.testing.assert_allclose(log[-1][key], whole[key], rtol=1e-5)


def test_one_process_and_resume(data_dir, tmp_path):
    full, resumed = tmp_path / 'full', tmp_path / 'resumed'
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 2,
                        '--out', full] + SMALL)
    assert code == 0, output
    log = read_log(full)
    assert [e['iteration'] for e in log] == [12, 24]
    assert log[-1]['validation/main/accuracy'] > 0.3
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 2,
                        '--out', resumed, '--resume',
                        full / 'snapshot_epoch_1'] + SMALL)
    assert code == 0, output
    again = read_log(resumed)
    assert len(again) == 2  # the log of epoch 1 came with the snapshot
    for a, b in zip(log, again):
        a.pop('elapsed_time'), b.pop('elapsed_time')
        assert a == pytest.approx(b, rel=1e-6)


def test_a_fraction_of_an_epoch_reports_and_logs(data_dir, tmp_path):
    # 0.5 epochs of 240 images at batch 20: 6 iterations, no epoch's end;
    # the last iteration evaluates, logs and prints like an epoch's end.
    out = tmp_path / 'out'
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', '0.5',
                        '--out', out] + SMALL)
    assert code == 0, output
    log = read_log(out)
    assert [entry['iteration'] for entry in log] == [6], log
    assert 0 <= log[0]['validation/main/accuracy'] <= 1
    assert 'validation/main/accuracy' in output


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_one_gpu(data_dir, tmp_path):
    out = tmp_path / 'out'
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 1,
                        '--device', 'gpu', '--out', out] + SMALL)
    assert code == 0, output
    assert 'device @cupy:0' in output
    log = read_log(out)
    assert log[0]['iteration'] == 12
    assert 0 <= log[0]['validation/main/accuracy'] <= 1


@pytest.mark.mpi
def test_missing_data_ends_every_rank(tmp_path):
    require_mpi()
    code, output = run([SCRIPT, '--data-dir', tmp_path, '--epoch', 1,
                        '--out', tmp_path / 'out'], nprocs=2, timeout=30)
    assert code != 0
    assert output.count('train_mnist.py: error:') == 1, output
    assert 'Fashion-MNIST IDX files' in output, output


@pytest.mark.mpi
def test_resume_refuses_another_world_size(data_dir, tmp_path):
    require_mpi()
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 1,
                        '--out', tmp_path / 'one'] + SMALL)
    assert code == 0, output
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 2,
                        '--out', tmp_path / 'two', '--resume',
                        tmp_path / 'one' / 'snapshot_epoch_1'] + SMALL,
                       nprocs=2, timeout=30)
    assert code != 0
    assert output.count('train_mnist.py: error:') == 1, output
    assert 'mpiexec -n 1' in output, output


def test_snapshot_every_keeps_epochs_and_the_newest_between(
        data_dir, tmp_path):
    full, resumed = tmp_path / 'full', tmp_path / 'resumed'
    every = ['--snapshot-every', 5] + SMALL  # 12 iterations an epoch
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 2,
                        '--out', full] + every)
    assert code == 0, output
    assert sorted(p.name for p in full.glob('snapshot_*')) == [
        'snapshot_iter_12', 'snapshot_iter_24']
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 1.5,
                        '--out', resumed] + every)
    assert code == 0, output  # 18 iterations: 15 stays, the newest between
    assert sorted(p.name for p in resumed.glob('snapshot_*')) == [
        'snapshot_iter_12', 'snapshot_iter_15']
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 2,
                        '--out', resumed, '--resume',
                        resumed / 'snapshot_iter_15'] + every)
    assert code == 0, output
    assert_same_model(full / 'snapshot_iter_24',
                      resumed / 'snapshot_iter_24')


@pytest.mark.mpi
def test_killed_job_resumes_from_the_newest_snapshot(data_dir, tmp_path):
    """train_mnist.py does not catch signals: SIGTERM to the launcher ends
    the ranks at once (Hydra passes it on; Open MPI's mpirun a second
    later), as a hard kill would. --snapshot-every bounds the loss: the
    newest snapshot on disk is a good one, and resuming from it ends where
    an uninterrupted run ends."""
    killed, full = tmp_path / 'killed', tmp_path / 'full'
    every = ['--snapshot-every', 4] + SMALL  # 6 iterations an epoch
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    proc = subprocess.Popen(mpi_command(
        2, sys.executable, SCRIPT, '--data-dir', data_dir, '--epoch', 1000,
        '--out', killed, *every), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(killed.glob('snapshot_iter_*')) and \
                proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0, out.decode(errors='replace')
    newest = max(snapshots(killed))
    assert newest < 6000, newest  # stopped before its 1000 epochs
    epochs = newest // 6 + 2  # a run that goes on past the snapshot
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', epochs,
                        '--out', killed, '--resume',
                        killed / 'snapshot_iter_{}'.format(newest)] + every,
                       nprocs=2)
    assert code == 0, output
    code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', epochs,
                        '--out', full] + every, nprocs=2)
    assert code == 0, output
    name = 'snapshot_iter_{}'.format(6 * epochs)
    assert_same_model(full / name, killed / name)


# -- docs/porting.md ----------------------------------------------------------
def page_scripts():
    """(Chainer script, minichain script, the page's diff) of the page."""
    page = read_page(PAGE)
    chainer_code, minichain_code = (b.code for b in page.blocks[:2])
    with open(PAGE, encoding='utf-8') as f:
        diffs = re.findall(r'^```diff\n(.*?)^```$', f.read(), re.S | re.M)
    assert len(diffs) == 1, 'docs/porting.md should show one diff'
    return chainer_code, minichain_code, diffs[0]


def test_porting_page_differs_only_in_imports():
    chainer_code, minichain_code, shown = page_scripts()
    assert 'import chainermn' in chainer_code
    assert 'from minichain import dist as chainermn' in minichain_code
    changed = [line[2:] for line in difflib.ndiff(
        chainer_code.splitlines(), minichain_code.splitlines())
        if line[:2] in ('- ', '+ ')]
    assert changed
    for line in changed:
        assert line == '' or line.startswith(('import ', 'from ')), line
    computed = ''.join(difflib.unified_diff(
        chainer_code.splitlines(True), minichain_code.splitlines(True),
        'train_mnist_chainer.py', 'train_mnist_minichain.py'))
    assert shown == computed, 'the diff shown in docs/porting.md is stale'


@pytest.mark.mpi
def test_porting_page_script_runs(data_dir, tmp_path):
    require_mpi()
    _, minichain_code, _ = page_scripts()
    script = tmp_path / 'train_mnist.py'
    script.write_text(minichain_code)
    out = tmp_path / 'out'
    code, output = run([script, '--epoch', 1, '--out', out] + SMALL,
                       nprocs=2, env={'MINICHAIN_DATASET_ROOT': data_dir})
    assert code == 0, output
    log = read_log(out)
    assert len(log) == 1 and log[0]['iteration'] == 6
    assert 0 <= log[0]['validation/main/accuracy'] <= 1


# The same checks as train_resnet50.py: one line from rank 0, nothing
# written (each was a traceback on both ranks, or a silent 3.3 epochs).
BAD = {
    'out is a file': (['--out', '{tmp}/afile'], 'it is a file, not a folder'),
    'unknown device': (['--device', 'bogus'],
                       "--device bogus: get_device: unknown device spec"),
    'batch > shard': (['-b', '100000', '--epoch', '0.05'],
                      "--batchsize 100000 is larger than each rank's shard "
                      "of 120 training images (2 processes)"),
}


@pytest.mark.mpi
@pytest.mark.parametrize('case', sorted(BAD))
def test_bad_input_is_one_line_on_rank_0(data_dir, tmp_path, case):
    require_mpi()
    (tmp_path / 'afile').write_text('')
    args, message = BAD[case]
    args = [a.format(tmp=tmp_path) for a in args]
    if '--out' not in args:
        args += ['--out', str(tmp_path / 'out')]
    code, output = run([SCRIPT, '--data-dir', data_dir, '--unit', '8']
                       + args, nprocs=2, timeout=60)
    assert code != 0 and 'Traceback' not in output, output
    errors = [line for line in output.splitlines() if 'error' in line]
    assert errors == [errors[0]] and errors[0].startswith(
        'train_mnist.py: error: '), output
    assert message in errors[0], output
    assert not (tmp_path / 'out').exists()


@pytest.mark.parametrize('argv, message', [
    (['--unit', '0'], '--unit must be at least 1, got 0'),
    (['--epoch', 'nan'], '--epoch must be > 0, got nan'),
    (['--seed', '-1'], '--seed must be in [0, 4294967296)'),
    (['--snapshot-interval', '-1'], '--snapshot-interval must be at least 0'),
])
def test_options_are_checked_as_train_resnet50s(argv, message):
    from models import train_mnist
    from models.train_checks import UserError
    with pytest.raises(UserError, match=re.escape(message)):
        train_mnist.parse_args(argv)


def test_mixed16_trains_in_bfloat16_on_the_cpu(data_dir, tmp_path):
    # --dtype mixed16: bfloat16 activations on the CPU, float32 parameters
    # and loss scaling; it learns as float32 does on these easy images.
    pytest.importorskip('ml_dtypes')
    accuracy = {}
    for dtype in ('float32', 'mixed16'):
        out = tmp_path / dtype
        code, output = run([SCRIPT, '--data-dir', data_dir, '--epoch', 2,
                            '--out', out, '--dtype', dtype] + SMALL)
        assert code == 0, output
        assert ', {}\n'.format(dtype) in output     # the header says so
        log = read_log(out)
        assert all(numpy.isfinite(e['main/loss']) for e in log)
        accuracy[dtype] = log[-1]['validation/main/accuracy']
    assert accuracy['mixed16'] > 0.3                # chance is 0.1
    assert abs(accuracy['mixed16'] - accuracy['float32']) < 0.15
