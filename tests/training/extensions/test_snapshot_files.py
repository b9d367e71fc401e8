"""snapshot(n_retains=..., autoload=...) and the file matching behind them."""
import os
import re

import numpy
import pytest

from minichain import dist, serializers
from minichain.training import extensions
from minichain.training.extensions import _snapshot_files
from tests.training._util import make_trainer


def _names(folder):
    return sorted(p for p in os.listdir(str(folder)) if p.startswith('snap'))


def _build(out, stop, **snapshot_args):
    trainer = make_trainer(out, stop=stop,
                           extensions=[extensions.LogReport()])
    snap = extensions.snapshot(**snapshot_args)
    trainer.extend(snap, trigger=(1, 'epoch'))
    return trainer, snap


def test_n_retains_keeps_the_newest_files(tmp_path):
    trainer, _ = _build(tmp_path, (4, 'epoch'), n_retains=2)
    (tmp_path / 'snapshot_notes.txt').write_text('mine')  # other pattern
    (tmp_path / 'snapshot_iter_x').write_text('')  # matches: oldest, goes
    trainer.run()
    # 24 examples, batch 5: epochs end at iterations 5, 10, 15, 20.
    assert _names(tmp_path) == ['snapshot_iter_15', 'snapshot_iter_20',
                                'snapshot_notes.txt']


def test_n_retains_none_or_chainers_minus_one_keeps_all(tmp_path):
    for n_retains, out in ((None, 'a'), (-1, 'b')):
        trainer, snap = _build(tmp_path / out, (2, 'epoch'),
                               n_retains=n_retains)
        trainer.run()
        assert snap.n_retains is None
        assert _names(tmp_path / out) == ['snapshot_iter_10',
                                          'snapshot_iter_5']


def test_autoload_resumes_from_the_newest_snapshot(tmp_path):
    full, _ = _build(tmp_path / 'full', (3, 'epoch'))
    full.run()
    part, _ = _build(tmp_path / 'part', (2, 'epoch'), n_retains=1)
    part.run()
    assert _names(tmp_path / 'part') == ['snapshot_iter_10']
    again, snap = _build(tmp_path / 'part', (3, 'epoch'), autoload=True,
                         n_retains=1)
    again.run()
    assert snap.autoloaded == str(tmp_path / 'part' / 'snapshot_iter_10')
    assert again.updater.iteration == 15
    log = again.get_extension('LogReport').log
    assert [e['epoch'] for e in log] == [1, 2, 3]
    want = full.updater.get_optimizer().target
    got = again.updater.get_optimizer().target
    for (name, a), (_, b) in zip(want.namedparams(), got.namedparams()):
        numpy.testing.assert_allclose(a.array, b.array, rtol=1e-6,
                                      err_msg=name)


def test_autoload_without_a_snapshot_starts_fresh(tmp_path):
    trainer, snap = _build(tmp_path, (1, 'epoch'), autoload=True)
    trainer.run()
    assert snap.autoloaded is None and trainer.updater.iteration == 5


def test_autoload_of_a_snapshot_that_does_not_fit_fails_naming_it(tmp_path):
    path = tmp_path / 'snapshot_iter_3'
    numpy.savez(str(path), **{'updater/iteration': numpy.array(3)})
    os.replace(str(path) + '.npz', str(path))
    trainer, _ = _build(tmp_path, (1, 'epoch'), autoload=True)
    with pytest.raises(KeyError, match='snapshot_iter_3'):
        trainer.run()


def test_newest_is_by_modification_time_then_by_number(tmp_path):
    pattern = 'snaps/iter_{.updater.iteration}.npz'
    folder = tmp_path / 'snaps'
    folder.mkdir()
    for name, mtime in (('iter_9.npz', 100), ('iter_10.npz', 100),
                        ('iter_2.npz', 50), ('.iter_11.npz.123.tmp', 200),
                        ('iter_.npz', 300), ('other_12.npz', 400)):
        (folder / name).write_text('')
        os.utime(str(folder / name), (mtime, mtime))
    assert [os.path.basename(p) for p in _snapshot_files.matching(
        str(tmp_path), pattern)] == ['iter_2.npz', 'iter_9.npz',
                                     'iter_10.npz']
    assert _snapshot_files.newest(str(tmp_path), pattern) == str(
        folder / 'iter_10.npz')
    assert _snapshot_files.newest(str(tmp_path / 'none'), pattern) is None
    removed = _snapshot_files.remove_stale(
        str(tmp_path), pattern, 1, str(folder / 'iter_2.npz'))
    assert sorted(os.path.basename(p) for p in removed) == [
        'iter_10.npz', 'iter_9.npz']  # the kept file is never removed
    assert sorted(os.listdir(str(folder))) == [
        '.iter_11.npz.123.tmp', 'iter_.npz', 'iter_2.npz', 'other_12.npz']


@pytest.mark.parametrize('kwargs, message', [
    ({'n_retains': 0}, 'n_retains must be at least 1'),
    ({'n_retains': 1.5}, 'n_retains must be at least 1, an int'),
    ({'n_retains': True}, 'n_retains must be at least 1, an int'),
    ({'autoload': True, 'filename': 'run{.updater.epoch}/snap'},
     'folder part has no {} fields'),
    ({'n_retains': 2, 'filename': 'snaps/'}, 'names a file'),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match='snapshot: .*' + re.escape(message)):
        extensions.snapshot(**kwargs)


def test_multi_node_snapshot_refuses_autoload():
    class OneRank:
        rank, size = 0, 1
    with pytest.raises(ValueError, match='autoload=True.*load\\(path, '
                       'trainer\\) on every rank'):
        dist.multi_node_snapshot(OneRank(), extensions.snapshot(
            autoload=True))


def test_snapshot_object_takes_the_same_options(tmp_path):
    trainer = make_trainer(tmp_path, stop=(3, 'epoch'))
    model = trainer.updater.get_optimizer().target
    trainer.extend(extensions.snapshot_object(
        model, 'model_{.updater.epoch}', n_retains=1), trigger=(1, 'epoch'))
    trainer.run()
    assert sorted(os.listdir(str(tmp_path))) == ['model_3']
    fresh = make_trainer(tmp_path / 'b', stop=(1, 'epoch'))
    target = fresh.updater.get_optimizer().target
    serializers.load_npz(str(tmp_path / 'model_3'), target)
    numpy.testing.assert_array_equal(target.predictor.l1.W.array,
                                     model.predictor.l1.W.array)
