"""models/train_checks.py: options, --out, resume settings, NaN, temporaries;
and the training script under mpiexec for each of them (one line, nothing
written, the last good snapshot kept)."""
import contextlib
import json
import os
import subprocess
import zipfile

import numpy
import pytest

from models import train_checks, train_data, train_resnet50
from models.train_data import UserError
from tests.models.test_train_resnet50 import (SMALL, data_args, fashion_dir,
                                              image_tree, run)

QUICK = ['--data', 'synthetic', '--train-subset', '8', '--val-subset', '4'] \
    + SMALL


# -- options ------------------------------------------------------------------
@pytest.mark.parametrize('argv, message', [
    (['--warmup', 'nan'], '--warmup must be >= 0, got nan'),
    (['--warmup', 'inf'], '--warmup must be >= 0, got inf'),
    (['--epoch', 'inf'], '--epoch must be > 0, got inf'),
    (['--epoch', '1e300'], 'more than a million epochs'),
    (['--lr', 'inf'], '--lr must be > 0, got inf'),
    (['--lr', '-0.1'], '--lr must be > 0'),
    (['--momentum', 'nan'], '--momentum must be in [0, 1), got nan'),
    (['--momentum', '1'], '--momentum must be in [0, 1)'),
    (['--weight-decay', 'nan'], '--weight-decay must be >= 0, got nan'),
    (['--weight-decay', 'inf'], '--weight-decay must be >= 0, got inf'),
    (['--seed', '-1'], '--seed must be in [0, 4294967296), got -1'),
    (['--keep', '0'], '--keep must be at least 1'),
    (['--nan-check', 'maybe'], "invalid choice: 'maybe'"),
    (['--image-size', '0'], '--image-size must be at least 1, got 0'),
    (['--loaderjob', '10000000'], '--loaderjob 10000000 is more than this '
     'machine allows: each worker holds 6 file descriptors'),
])
def test_bad_options_are_one_line(argv, message):
    with pytest.raises(UserError) as e:
        train_resnet50.parse_args(argv)
    assert message in str(e.value) and '\n' not in str(e.value)
    assert e.value.status == 2


def test_the_loader_bound_follows_the_open_file_limit(monkeypatch):
    monkeypatch.setattr(train_checks, '_open_file_limit', lambda: 1024)
    assert train_checks.loaderjob_limit() == (1024 - 256) // 6 == 128
    train_resnet50.parse_args(['--loaderjob', '128'])
    with pytest.raises(UserError, match='open-file limit is 1024 '
                       r'\(ulimit -n\), so at most 128'):
        train_resnet50.parse_args(['--loaderjob', '129'])


def test_good_options_pass():
    args = train_resnet50.parse_args(['--momentum', '0', '--warmup', '0',
                                      '--weight-decay', '0', '--seed', '7'])
    assert (args.keep, args.nan_check, args.seed) == (2, 'on', 7)


# -- --out --------------------------------------------------------------------
def test_check_out_creates_nothing(tmp_path):
    out = tmp_path / 'a' / 'b'
    assert train_checks.check_out(str(out)) == str(tmp_path)
    assert os.listdir(str(tmp_path)) == []
    (tmp_path / 'file').write_text('x')
    with pytest.raises(UserError, match='it is a file, not a folder'):
        train_checks.check_out(str(tmp_path / 'file'))
    with pytest.raises(UserError, match='is a file, so no folder can be '
                       'made under it'):
        train_checks.check_out(str(tmp_path / 'file' / 'sub'))
    with pytest.raises(UserError, match='MB free on its file system, but a '
                       'snapshot of this model takes about'):
        train_checks.check_free_space(str(out), 1 << 60)
    train_checks.check_free_space(str(out), 1 << 10)


@contextlib.contextmanager
def _mounted(path, options):
    """A tmpfs mounted at ``path`` (root only), or None where mounting is
    not allowed."""
    path.mkdir()
    try:
        done = subprocess.run(['mount', '-t', 'tmpfs', '-o', options, 'tmpfs',
                               str(path)], capture_output=True)
    except OSError:
        done = None
    if done is None or done.returncode != 0:
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(['umount', str(path)], capture_output=True)


@pytest.fixture
def read_only(tmp_path):
    """A folder nothing can be written in: mode 0555, or for root (whom
    modes do not stop) a read-only mount."""
    if os.geteuid() != 0:
        folder = tmp_path / 'ro'
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    with _mounted(tmp_path / 'ro', 'ro,size=1m') as folder:
        if folder is None:
            pytest.skip('root cannot mount a read-only tmpfs here')
        yield folder


@pytest.fixture
def small_disk(tmp_path):
    """A 20 MB file system (a ResNet-18 snapshot needs about 85 MB)."""
    with _mounted(tmp_path / 'small', 'size=20m') as folder:
        if folder is None:
            pytest.skip('cannot mount a small tmpfs here (needs root)')
        yield folder


def _one_line(rc, out, err, message):
    assert rc != 0, out + err
    assert 'Traceback' not in out + err
    lines = err.strip().split('\n')
    assert len(lines) == 1, lines
    assert lines[0].startswith('train_resnet50.py: error: '), lines
    assert message in lines[0], lines


@pytest.mark.mpi
@pytest.mark.parametrize('case', ['file', 'under a file', 'read-only',
                                  'full disk'])
def test_bad_out_is_one_line_and_nothing_is_written(tmp_path, case, request):
    (tmp_path / 'file').write_text('x')
    out, message = {
        'file': (tmp_path / 'file', 'it is a file, not a folder'),
        'under a file': (tmp_path / 'file' / 'out', 'is a file, so no '
                         'folder can be made'),
        'read-only': (None, 'cannot write in'),
        'full disk': (None, 'MB free on its file system'),
    }[case]
    if case == 'read-only':
        out = request.getfixturevalue('read_only') / 'out'
    elif case == 'full disk':
        out = request.getfixturevalue('small_disk') / 'out'
    before = _tree(tmp_path)
    _one_line(*run(2, QUICK + ['--out', out], timeout=90), message)
    assert _tree(tmp_path) == before


def _tree(folder):
    return sorted(os.path.join(d, n) for d, dirs, files in os.walk(
        str(folder)) for n in dirs + files)


# -- data ---------------------------------------------------------------------
def test_label_outside_the_classes_is_one_line(tmp_path):
    folder = fashion_dir(tmp_path)
    raw = numpy.arange(12) % 10
    raw[7] = 200
    from tests.models.test_train_resnet50 import write_idx
    write_idx(folder / 'train-labels-idx1-ubyte.gz', raw, True)
    with pytest.raises(UserError, match='label 200 at index 7'):
        train_data._arrays(data_args(data_dir=str(folder)))


def test_a_batch_of_unreadable_images_is_a_user_error():
    with pytest.raises(UserError, match='every image of a batch of 2 was '
                       'unreadable'):
        train_data.CropConverter(8, True)([None, None])


@pytest.mark.mpi
def test_unreadable_batches_and_bombs_stop_every_rank_with_one_line(tmp_path):
    root = image_tree(tmp_path, per_class=0, corrupt=False)
    for cls in ('cat', 'dog'):  # a training set of unreadable images
        for i in range(4):
            (root / 'train' / cls / 'bad{}.png'.format(i)).write_bytes(
                b'not a png')
    from tests.datasets.test_image_dataset import _bomb
    _bomb(root / 'train' / 'cat' / 'bomb.png')
    rc, out, err = run(2, ['--data', 'imagenet', '--data-dir', root,
                           '--out', tmp_path / 'out'] + SMALL
                       + ['--batchsize', '3'], timeout=120)
    assert rc != 0 and 'Traceback' not in out + err, out + err
    errors = [line for line in err.split('\n') if 'error:' in line]
    assert len(errors) == 1, err
    assert 'every image of a batch of 3 was unreadable' in errors[0], err
    assert 'bomb.png' in err  # skipped with a warning, not a crash


# -- snapshots ----------------------------------------------------------------
def test_stale_temporaries_and_the_last_snapshot(tmp_path):
    dead = 2 ** 22 + 11
    ours = ['.snapshot_iter_4.{}.tmp'.format(dead),
            '..snapshot_iter_4.{0}.tmp.{0}.00ff00ff.tmp'.format(dead),
            '.log.{}.12ab34cd.tmp'.format(dead),
            '.loss.png.{}.aaaabbbb.tmp'.format(dead)]
    theirs = ['.notes.{}.tmp'.format(dead), 'snapshot_iter_9',
              'snapshot_iter_10', 'snapshot_iter_x']
    for name in ours + theirs:
        (tmp_path / name).write_bytes(b'x')
    removed = train_checks.remove_stale_temporaries(str(tmp_path))
    assert sorted(removed) == sorted(str(tmp_path / n) for n in ours)
    assert sorted(os.listdir(str(tmp_path))) == sorted(theirs)
    assert train_checks.last_snapshot(str(tmp_path)) == str(
        tmp_path / 'snapshot_iter_10')
    assert train_checks.describe_last(str(tmp_path / 'none')) == \
        'no snapshot was written'


def _flip_a_byte(path):
    """Flip a byte inside the first member's data (as a bad disk would)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(str(path)) as z:
        offset = z.infolist()[-1].header_offset
    name = int.from_bytes(data[offset + 26:offset + 28], 'little')
    extra = int.from_bytes(data[offset + 28:offset + 30], 'little')
    data[offset + 30 + name + extra + 100] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_snapshot_is_refused_before_loading(tmp_path):
    from minichain.dist.extensions import check_archive
    path = tmp_path / 'snap.npz'
    numpy.savez(str(path), w=numpy.arange(100.0))
    check_archive(path.read_bytes(), path)
    _flip_a_byte(path)
    with pytest.raises(ValueError, match='fails its CRC check'):
        check_archive(path.read_bytes(), path)
    with pytest.raises(ValueError, match='not a whole npz archive'):
        check_archive(path.read_bytes()[:50], path)


def test_check_resume_names_old_and_new_values(tmp_path):
    args = train_resnet50.parse_args(['--data', 'synthetic'])
    old = train_checks.settings(args, 'aaaa')
    path = tmp_path / 'snap.npz'
    numpy.savez(str(path), **{train_checks.RunSettings.key: json.dumps(old)})
    train_checks.check_resume(str(path), old)
    new = dict(old, batchsize=4, seed=1, bn='sync')
    new['data fingerprint'] = 'bbbb'
    with pytest.raises(UserError) as e:
        train_checks.check_resume(str(path), new)
    for part in ('--batchsize 32 (this run: 4)', '--seed 0 (this run: 1)',
                 '--bn local (this run: sync)',
                 'the training data aaaa (this run: bbbb)'):
        assert part in str(e.value), e.value
    numpy.savez(str(path), other=numpy.zeros(1))
    train_checks.check_resume(str(path), new)  # no settings: nothing to say


@pytest.mark.mpi
@pytest.mark.slow
def test_keep_resume_settings_nan_stop_and_temporaries(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    dead = 2 ** 22 + 5
    stale = out / '.snapshot_iter_2.{}.tmp'.format(dead)
    stale.write_bytes(b'half a snapshot')
    rc, stdout, err = run(2, QUICK + ['--epoch', '3', '--keep', '1', '--out',
                                      out], timeout=180)
    assert rc == 0, stdout + err
    assert 'removed 1 temporary file of interrupted writes' in stdout
    assert not stale.exists()
    snapshots = sorted(n for n in os.listdir(str(out))
                       if n.startswith('snapshot_iter_'))
    assert snapshots == ['snapshot_iter_6']  # --keep 1
    good = out / 'snapshot_iter_6'
    good_bytes = good.read_bytes()

    # another --batchsize, --seed, --bn or data: refused, naming both
    rc, stdout, err = run(2, QUICK + ['--out', out, '--resume', good,
                                      '--batchsize', '1', '--seed', '2',
                                      '--bn', 'sync', '--train-subset', '6'],
                          timeout=120)
    _one_line(rc, stdout, err, '--batchsize 2 (this run: 1)')
    for part in ('--seed 0 (this run: 2)', '--bn local (this run: sync)',
                 '--train-subset 8 (this run: 6)', 'the training data'):
        assert part in err, err

    # a learning rate that blows the weights up: the first non-finite
    # gradient stops training; no NaN snapshot, the good one is kept
    rc, stdout, err = run(2, QUICK + ['--out', out, '--resume', good,
                                      '--epoch', '6', '--lr', '1e38'],
                          timeout=120)
    errors = [line for line in err.split('\n') if 'error:' in line]
    assert rc != 0 and len(errors) == 1 and 'Traceback' not in err, err
    assert 'the averaged gradient holds inf or NaN' in errors[0], err
    assert 'the last good snapshot is {}'.format(good) in errors[0], err
    assert good.read_bytes() == good_bytes
    assert sorted(n for n in os.listdir(str(out)) if 'snapshot' in n) == [
        'snapshot_iter_6']

    # the same with the check off: the model goes NaN, the log says null,
    # and the snapshot at the epoch's end is refused
    rc, stdout, err = run(2, QUICK + ['--out', out, '--resume', good,
                                      '--epoch', '6', '--lr', '1e38',
                                      '--nan-check', 'off'], timeout=120)
    errors = [line for line in err.split('\n') if 'error:' in line]
    assert rc != 0 and len(errors) == 1 and 'Traceback' not in err, err
    assert 'the model holds inf or NaN, so no snapshot was written' in \
        errors[0], err
    log = json.loads((out / 'log').read_text())  # valid JSON
    assert any(e['main/loss'] is None for e in log), log
    assert good.read_bytes() == good_bytes
    assert sorted(n for n in os.listdir(str(out)) if 'snapshot' in n) == [
        'snapshot_iter_6']

    # a damaged snapshot: one line
    bad = tmp_path / 'damaged'
    bad.write_bytes(good_bytes)
    _flip_a_byte(bad)
    _one_line(*run(2, QUICK + ['--out', out, '--resume', bad], timeout=120),
              'fails its CRC check')
