"""models/train_resnet50.py: data paths, runs under mpiexec, resume, errors."""
import argparse
import gzip
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import warnings

import numpy
import pytest

from models import train_data
from models.train_data import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
SCRIPT = os.path.join(ROOT, 'models', 'train_resnet50.py')
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
def mpiexec():
    pytest.importorskip('mpi4py', reason='mpi4py is not installed')
    path = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    if not os.path.exists(path):
        pytest.skip('no mpiexec next to {}'.format(sys.executable))
    return path


def launch(n, args):
    """Start the script (under ``mpiexec -n n``; n=None: one plain process)."""
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1',
               MPLBACKEND='Agg')
    env.pop('MINICHAIN_NO_ABORT', None)
    cmd = ([mpiexec(), '-n', str(n)] if n else []) + [sys.executable, SCRIPT]
    return subprocess.Popen(cmd + [str(a) for a in args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


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


def model_arrays(path):
    with numpy.load(path) as npz:
        return {k: npz[k] for k in npz.files
                if k.startswith('updater/model:main/')}


@pytest.mark.mpi
@pytest.mark.slow
def test_synthetic_run_sigterm_and_resume_equal_uninterrupted(tmp_path):
    common = ['--data', 'synthetic', '--train-subset', '24', '--val-subset',
              '10', '--iteration', '12', '--seed', '3'] + SMALL
    a, b = tmp_path / 'a', tmp_path / 'b'
    rc, out, err = run(2, common + ['--out', a, '--graph'])
    assert rc == 0, out + err
    assert 'test accuracy' in out and 'Traceback' not in err
    log = json.loads((a / 'log').read_text())
    assert [e['epoch'] for e in log] == [1, 2]
    for key in ('lr', 'main/loss', 'main/accuracy', 'validation/main/loss',
                'validation/main/accuracy', 'images_per_sec', 'elapsed_time'):
        assert all(key in e for e in log), key
    for name in ('loss.png', 'accuracy.png', 'graph.dot', 'snapshot_iter_6',
                 'snapshot_iter_12'):
        assert (a / name).exists(), name

    proc = launch(2, common + ['--out', b])
    for line in proc.stdout:  # setup done, training starts now
        if line.startswith('peak lr'):
            break
    proc.send_signal(signal.SIGTERM)  # to mpiexec, as a batch system does
    rc, out, err = finish(proc)
    assert rc == 128 + signal.SIGTERM, out + err
    assert 'Traceback' not in err
    stopped = [w for w in out.split('\n') if w.startswith('stopped by')]
    assert stopped and 'SIGTERM' in stopped[0], out
    it = int(stopped[0].split('iteration ')[1].split(';')[0])
    assert it < 12 and (b / 'snapshot_iter_{}'.format(it)).exists()

    snapshot = b / 'snapshot_iter_{}'.format(it)
    rc, out, err = run(2, common + ['--out', b, '--resume', snapshot,
                                    '--keep', '10'])
    assert rc == 0, out + err
    expected = model_arrays(a / 'snapshot_iter_12')
    got = model_arrays(b / 'snapshot_iter_12')
    assert sorted(got) == sorted(expected) and len(got) > 50
    for k in expected:
        numpy.testing.assert_array_equal(got[k], expected[k], err_msg=k)

    rc, out, err = run(None, common + ['--out', b, '--resume', snapshot],
                       timeout=60)
    assert rc != 0 and 'Traceback' not in out + err
    assert err.strip().count('\n') == 0, err
    assert 'written by a run with 2 processes, but this run has 1' in err


@pytest.mark.mpi
def test_imagenet_layout_run_skips_corrupt_images(tmp_path):
    root = image_tree(tmp_path, per_class=6)
    rc, out, err = run(2, ['--data', 'imagenet', '--data-dir', root,
                           '--epoch', '1', '--out', tmp_path / 'out'] + SMALL
             + ['--batchsize', '3'])  # >= 2 left when bad.png is dropped
    assert rc == 0, out + err
    assert 'cannot decode image' in err and 'bad.png' in err
    log = json.loads((tmp_path / 'out' / 'log').read_text())
    assert log[-1]['skipped_images'] == 1


BAD = {
    'missing data dir': (['--data-dir', '{tmp}/nope'], 'no such folder'),
    'no idx files': (['--data-dir', '{tmp}'], 'were not found'),
    'empty class': (['--data', 'imagenet', '--data-dir', '{tree}'],
                    'emu has no images'),
    'batch > shard': (['--data', 'synthetic', '--train-subset', '8',
                       '--batchsize', '16'], 'larger than each rank'),
    'batch < 1': (['--batchsize', '0'], '--batchsize must be at least 1'),
    'unknown arch': (['--arch', 'resnet51'], "invalid choice: 'resnet51'"),
    'missing snapshot': (['--data', 'synthetic', '--resume', '{tmp}/nope'],
                         'cannot read snapshot'),
    'corrupt snapshot': (['--data', 'synthetic', '--resume', '{tmp}/junk'],
                         'cannot read snapshot'),
    'lr inf': (['--lr', 'inf'], '--lr must be > 0, got inf'),
    'seed -1': (['--seed', '-1'], '--seed must be in [0, 4294967296)'),
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
