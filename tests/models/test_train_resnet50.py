"""models/train_resnet50.py: data paths, runs under mpiexec, resume, errors."""
import argparse
import gzip
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import warnings

import numpy
import pytest

from minichain.dist import launcher
from models import train_data
from models.train_data import UserError
from tests.dist._launch import mpi_command
from tests.models._snapshots import assert_same_model, model_arrays, snapshots

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
# run as a module from the checkout, as README.md says
SCRIPT = ['-m', 'models.train_resnet50']
SMALL = ['--arch', 'resnet18', '--image-size', '8', '--batchsize', '2',
         '--val-batchsize', '4']


# -- generated data -----------------------------------------------------------
def write_idx(path, array, gz):
    header = struct.pack('>BBBB', 0, 0, 0x08, array.ndim) + struct.pack(
        '>{}I'.format(array.ndim), *array.shape)
    data = header + array.astype(numpy.uint8).tobytes()
    with open(path, 'wb') as f:
        f.write(gzip.compress(data) if gz else data)


def fashion_dir(tmp_path, n_train=12, n_test=6):
    rng = numpy.random.default_rng(0)
    folder = tmp_path / 'fashion'
    folder.mkdir()
    for prefix, n, gz in (('train', n_train, True), ('t10k', n_test, False)):
        write_idx(folder / '{}-images-idx3-ubyte{}'.format(
            prefix, '.gz' if gz else ''),
            rng.integers(0, 256, (n, 28, 28)), gz)
        write_idx(folder / '{}-labels-idx1-ubyte{}'.format(
            prefix, '.gz' if gz else ''), numpy.arange(n) % 10, gz)
    return folder


def image_tree(tmp_path, per_class=4, empty_class=False, corrupt=True):
    Image = pytest.importorskip('PIL.Image')
    rng = numpy.random.default_rng(0)
    root = tmp_path / 'imagenet'
    for split, n in (('train', per_class), ('val', 2)):
        for cls in ('cat', 'dog'):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 256, (12, 10 + i, 3), numpy.uint8)
                Image.fromarray(pixels).save(root / split / cls /
                                             '{}.png'.format(i))
    if corrupt:
        (root / 'train' / 'cat' / 'bad.png').write_bytes(b'not a png')
    if empty_class:
        (root / 'train' / 'emu').mkdir()
        (root / 'val' / 'emu').mkdir()
    return root


def data_args(**kw):
    base = dict(data='fashion-mnist', data_dir=None, train_subset=None,
                val_subset=None, seed=0, image_size=8)
    base.update(kw)
    return argparse.Namespace(**base)


# -- data paths, in process ---------------------------------------------------
def test_fashion_mnist_from_idx_files(tmp_path):
    folder = fashion_dir(tmp_path)
    (x, t), (xv, tv), n_classes, channels = train_data._arrays(
        data_args(data_dir=str(folder)))
    assert x.shape == (12, 1, 28, 28) and xv.shape == (6, 1, 28, 28)
    assert x.dtype == numpy.float32 and (n_classes, channels) == (10, 1)
    pixels = numpy.frombuffer(gzip.decompress(
        (folder / 'train-images-idx3-ubyte.gz').read_bytes())[16:],
        numpy.uint8)
    expected = (pixels.reshape(12, 1, 28, 28) / 255. - train_data.FASHION_MEAN
                ) / train_data.FASHION_STD
    numpy.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-5)
    numpy.testing.assert_array_equal(tv, numpy.arange(6) % 10)
    (x5, t5), _, _, _ = train_data._arrays(data_args(data_dir=str(folder),
                                                     train_subset=5))
    assert len(x5) == len(t5) == 5
    with pytest.raises(UserError, match='--train-subset 13 is larger'):
        train_data._arrays(data_args(data_dir=str(folder), train_subset=13))
    with pytest.raises(UserError, match='no such folder'):
        train_data._arrays(data_args(data_dir=str(tmp_path / 'nope')))
    with pytest.raises(UserError, match='not found'):
        train_data._arrays(data_args(data_dir=str(tmp_path)))


def test_image_folders_skip_corrupt_and_crop(tmp_path):
    root = image_tree(tmp_path)
    train, val = train_data._image_folders(data_args(data_dir=str(root)))
    assert train.classes == val.classes == ['cat', 'dog'] and len(train) == 9
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        examples = [train_data._resize(train[i], 9) for i in range(len(train))]
    assert train.n_skipped == 1 and examples.count(None) == 1
    assert any('bad.png' in str(w.message) for w in caught)
    assert all(min(e[0].shape[1:]) == 9 for e in examples if e is not None)
    for is_train in (True, False):
        conv = train_data.CropConverter(8, is_train)
        conv.reseed((0, 0, 1))
        x, t = conv(examples)
        assert x.shape == (8, 3, 8, 8) and x.dtype == numpy.float32
        assert len(t) == 8 and abs(float(x.mean())) < 1.0


def test_image_folder_errors(tmp_path):
    root = image_tree(tmp_path, empty_class=True)
    with pytest.raises(UserError, match='emu has no images'):
        train_data._image_folders(data_args(data_dir=str(root)))
    shutil.rmtree(root / 'val')
    with pytest.raises(UserError, match='no val folder'):
        train_data._image_folders(data_args(data_dir=str(root)))


# -- runs under mpiexec -------------------------------------------------------
def launch(n, args):
    """Start the script (under the launcher with n ranks; n=None: one plain
    process)."""
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1',
               MPLBACKEND='Agg')
    env.pop('MINICHAIN_NO_ABORT', None)
    cmd = [sys.executable] + SCRIPT + [str(a) for a in args]
    if n:
        cmd = mpi_command(n, *cmd)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc, timeout=120):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail('hung (killed after {} s):\n{}\n{}'.format(timeout, out,
                                                              err))
    return proc.returncode, out, err


def run(n, args, timeout=120):
    return finish(launch(n, args), timeout)


def test_precision_is_bf16_where_the_cpu_has_it_and_said(tmp_path,
                                                         monkeypatch):
    # --precision auto (the default, make train's): bf16 compute where
    # oneDNN dispatches to bfloat16 instructions, float32 elsewhere
    # (ONEDNN_MAX_CPU_ISA plays a CPU without them); the header says which.
    onednn = pytest.importorskip('minichain.kernels.onednn')
    has, isa = onednn.bf16_compute()
    tiny = ['--data', 'synthetic', '--train-subset', '4', '--val-subset', '4',
            '--iteration', '1'] + SMALL
    cases = [([], {}, re.escape(
        'bf16 compute ({})'.format(isa) if has else 'float32 ({})'.format(
            isa) if isa.startswith('oneDNN') else
        'float32 ({}: no bfloat16 instructions)'.format(isa))),
             (['--precision', 'float32'], {}, 'float32'),
             (['--precision', 'mixed16'], {},   # (before the env cases)
              re.escape('mixed16 (bfloat16 activations)')),
             ([], {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE',
                   'MINICHAIN_ONEDNN': 'auto'},
              r'float32 \(avx[0-9a-z_]*: no bfloat16 instructions\)'),
             ([], {'MINICHAIN_ONEDNN': 'never'},
              re.escape('float32 (oneDNN is not {})'.format(
                  'in use' if onednn.available() else 'installed')))]
    if not onednn.available():   # no ISA to cap
        cases = [c for c in cases if 'ONEDNN_MAX_CPU_ISA' not in c[1]]
    for i, (extra, env, words) in enumerate(cases):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        rc, out, err = run(None, tiny + extra + ['--out', tmp_path / str(i)])
        assert rc == 0, out + err
        assert re.search('batch 2 per rank, {}$'.format(words),
                         out.splitlines()[0]), out


SYNTHETIC = ['--data', 'synthetic', '--train-subset', '24', '--val-subset',
             '10', '--iteration', '24', '--seed', '3', '--snapshot-every',
             '3'] + SMALL  # 6 iterations an epoch


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp('uninterrupted')
    rc, stdout, err = run(2, SYNTHETIC + ['--out', out, '--graph',
                                          '--keep', '10'])
    assert rc == 0, stdout + err
    return out, stdout, err


@pytest.mark.mpi
@pytest.mark.slow
def test_synthetic_run_writes_log_plots_and_snapshots(uninterrupted):
    a, out, err = uninterrupted
    assert 'test accuracy' in out and 'Traceback' not in err
    # the end reads cleanly: every table row on a line of its own (what a
    # terminal shows after the line's last carriage return), the
    # evaluation's own progress, and the summary
    visible = [line.rsplit('\r', 1)[-1].split() for line in out.split('\n')]
    rows = [v[:2] for v in visible if v and v[0] in ('epoch', '1', '2', '3',
                                                      '4')]
    assert rows == [['epoch', 'iteration'], ['1', '6'], ['2', '12'],
                    ['3', '18'], ['4', '24']], out
    assert 'validation:' in out or 'validation 1/' in out
    assert 'done: 24 iterations, 96 images (4.00 epochs) in ' in out
    log = json.loads((a / 'log').read_text())
    assert [e['epoch'] for e in log] == [1, 2, 3, 4]
    for key in ('lr', 'main/loss', 'main/accuracy', 'validation/main/loss',
                'validation/main/accuracy', 'images_per_sec', 'elapsed_time'):
        assert all(key in e for e in log), key
    for name in ('loss.png', 'accuracy.png', 'graph.dot'):
        assert (a / name).exists(), name
    # every epoch's snapshot stays (--keep 10); of those in between (every 3
    # iterations) each replaced the one before, and the last was removed
    # by the epoch's that followed it
    assert sorted(snapshots(a)) == [6, 12, 18, 24]


@pytest.mark.mpi
@pytest.mark.slow
def test_overlap_off_trains_the_same_as_the_default_overlapped_run(
        tmp_path, uninterrupted):
    a, out, _ = uninterrupted
    assert 'flat communicator, overlapped, cpu' in out
    rc, stdout, err = run(2, SYNTHETIC + ['--out', tmp_path, '--overlap',
                                          'off'])
    assert rc == 0, stdout + err
    assert 'flat communicator, cpu' in stdout
    want = json.loads((a / 'log').read_text())
    got = json.loads((tmp_path / 'log').read_text())
    for key in ('main/loss', 'validation/main/loss'):
        assert [e[key] for e in got] == pytest.approx(
            [e[key] for e in want], rel=1e-4), key


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize('signame', ['SIGTERM', 'SIGUSR1'])
def test_signal_to_launcher_then_resume_equals_uninterrupted(
        tmp_path, uninterrupted, signame):
    """A batch system signals the launcher, not the ranks. Hydra (MPICH)
    and srun pass SIGTERM on and wait; Open MPI's mpirun kills the ranks
    about a second later and exits 1. Whatever the launcher does, the
    newest snapshot on disk is a good one, and resuming from it ends with
    the uninterrupted run's weights, bit for bit."""
    signum = getattr(signal, signame)
    b = tmp_path / 'b'
    proc = launch(2, SYNTHETIC + ['--out', b])
    try:
        for line in proc.stdout:  # setup done, training starts now
            if line.startswith('peak lr'):
                break
        while not snapshots(b) and proc.poll() is None:
            time.sleep(0.02)  # the first snapshot (iteration 3) is there
    finally:
        proc.send_signal(signum)  # to the launcher, as a batch system does
    rc, out, err = finish(proc)
    killed = signum == signal.SIGTERM and launcher.flavor() == 'openmpi'
    assert rc == (1 if killed else 128 + signum), out + err
    stopped = [w for w in out.split('\n') if w.startswith('stopped by')]
    if not killed:
        assert 'Traceback' not in err
        assert stopped and signame in stopped[0], out
        it = int(stopped[0].split('iteration ')[1].split(';')[0])
        assert max(snapshots(b)) == it
    last, path = max(snapshots(b).items())
    assert 3 <= last < 24, sorted(snapshots(b))  # it was interrupted

    rc, out, err = run(2, SYNTHETIC + ['--out', b, '--resume', path,
                                       '--keep', '10'])
    assert rc == 0, out + err
    assert_same_model(uninterrupted[0] / 'snapshot_iter_24',
                      b / 'snapshot_iter_24', at_least=50)


@pytest.mark.mpi
def test_resume_with_another_number_of_processes_is_refused(uninterrupted):
    snapshot = uninterrupted[0] / 'snapshot_iter_12'
    rc, out, err = run(None, SYNTHETIC + ['--out', snapshot.parent / 'one',
                                          '--resume', snapshot], timeout=60)
    assert rc != 0 and 'Traceback' not in out + err
    assert err.strip().count('\n') == 0, err
    assert 'written by a run with 2 processes, but this run has 1' in err


@pytest.mark.mpi
def test_imagenet_layout_run_skips_corrupt_images_with_loader_workers(
        tmp_path):
    root = image_tree(tmp_path, per_class=6)
    models = []
    for jobs in (0, 1):  # 0: decoded in the training process (the default)
        folder = tmp_path / 'out{}'.format(jobs)
        rc, out, err = run(2, ['--data', 'imagenet', '--data-dir', root,
                               '--epoch', '1', '--out', folder] + SMALL
                           + ['--batchsize', '3',  # >= 2 left without bad.png
                              '--loaderjob', jobs])
        assert rc == 0, out + err
        assert ('1 loader process per rank' in out) == (jobs == 1), out
        assert 'cannot decode image' in err and 'bad.png' in err
        assert 'Traceback' not in err
        log = json.loads((folder / 'log').read_text())
        assert log[-1]['skipped_images'] == 1
        snapshots = sorted(folder.glob('snapshot_iter_*'))
        models.append(model_arrays(snapshots[-1]))
    assert sorted(models[0]) == sorted(models[1]) and len(models[0]) > 50
    for k in models[0]:  # the same batches and crops: the same weights
        numpy.testing.assert_array_equal(models[1][k], models[0][k],
                                         err_msg=k)


BAD = {
    'missing data dir': (['--data-dir', '{tmp}/nope'], 'no such folder'),
    'no idx files': (['--data-dir', '{tmp}'], 'were not found'),
    'empty class': (['--data', 'imagenet', '--data-dir', '{tree}'],
                    'emu has no images'),
    'batch > shard': (['--data', 'synthetic', '--train-subset', '8',
                       '--batchsize', '16'], 'larger than each rank'),
    'batch < 1': (['--batchsize', '0'], '--batchsize must be at least 1'),
    'loaderjob < 0': (['--loaderjob', '-1'], '--loaderjob must be at least 0'),
    'unknown arch': (['--arch', 'resnet51'], "invalid choice: 'resnet51'"),
    'bad interval': (['--snapshot-every', '10x'], 'argument --snapshot-every'),
    'missing snapshot': (['--data', 'synthetic', '--resume', '{tmp}/nope'],
                         'cannot read snapshot'),
    'corrupt snapshot': (['--data', 'synthetic', '--resume', '{tmp}/junk'],
                         'cannot read snapshot'),
    'lr inf': (['--lr', 'inf'], '--lr must be > 0, got inf'),
    'seed -1': (['--seed', '-1'], '--seed must be in [0, 4294967296)'),
    'bucket-mb 0': (['--bucket-mb', '0'], '--bucket-mb must be > 0, got 0'),
    'overlap naive': (['--data', 'synthetic', '--overlap', 'on',
                       '--communicator', 'naive'],
                      'the naive communicator cannot overlap'),
}


@pytest.mark.mpi
@pytest.mark.parametrize('case', sorted(BAD))
def test_bad_input_is_one_line_and_nonzero_exit(tmp_path, case):
    args, message = BAD[case]
    tree = image_tree(tmp_path, empty_class=True) if case == 'empty class' \
        else None
    (tmp_path / 'junk').write_bytes(b'PK\x03\x04 not a zip file')
    args = [a.format(tmp=tmp_path, tree=tree) for a in args]
    rc, out, err = run(2, args + ['--out', tmp_path / 'out'], timeout=60)
    assert rc != 0
    assert 'Traceback' not in out + err
    lines = err.strip().split('\n')
    assert len(lines) == 1 and lines[0].startswith('train_resnet50.py: error:')
    assert message in lines[0], lines
    assert not (tmp_path / 'out').exists()  # nothing was written


def test_run_as_a_file_says_how_to_run_it():
    proc = subprocess.run([sys.executable, os.path.join(
        ROOT, 'models', 'train_resnet50.py')], cwd=ROOT, capture_output=True,
        text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == ('run it from the repository root as: python -m '
                           'models.train_resnet50 [options]\n')
