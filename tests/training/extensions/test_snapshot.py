import os

import numpy
import pytest

from minichain import serializers
from minichain.training import extensions
from tests.training._util import make_model, make_trainer


def _extensions(snapshot_trigger):
    return [
        (extensions.LogReport(), {}),
        (extensions.ExponentialShift('lr', 0.5), {'trigger': (1, 'epoch')}),
        (extensions.observe_lr(), {}),
        (extensions.snapshot(), {'trigger': snapshot_trigger}),
    ]


def _build(out, stop, snapshot_trigger=(1, 'epoch')):
    trainer = make_trainer(out, stop=stop)
    for ext, kwargs in _extensions(snapshot_trigger):
        trainer.extend(ext, **kwargs)
    return trainer


def _state(trainer):
    model = trainer.updater.get_optimizer().target
    log = [{k: v for k, v in e.items() if k != 'elapsed_time'}
           for e in trainer.get_extension('LogReport').log]
    return {p: a.array.copy() for p, a in model.namedparams()}, log


@pytest.mark.parametrize('stop_at, trigger', [
    ((2, 'epoch'), (1, 'epoch')),        # resume at an epoch boundary
    ((7, 'iteration'), (7, 'iteration')),  # resume mid-epoch
])
def test_resume_gives_the_same_run(tmp_path, stop_at, trigger):
    full = _build(tmp_path / 'full', (4, 'epoch'), trigger)
    full.run()
    first = _build(tmp_path / 'part', stop_at, trigger)
    first.run()
    iteration = first.updater.iteration
    path = tmp_path / 'part' / 'snapshot_iter_{}'.format(iteration)
    assert path.is_file()
    second = _build(tmp_path / 'part', (4, 'epoch'), trigger)
    serializers.load_npz(str(path), second)
    assert second.updater.iteration == iteration
    second.run()
    params, log = _state(full)
    params2, log2 = _state(second)
    assert params.keys() == params2.keys()
    for key in params:
        numpy.testing.assert_array_equal(params[key], params2[key])
    assert log2 == log
    opt, opt2 = (t.updater.get_optimizer() for t in (full, second))
    assert opt2.t == opt.t and opt2.epoch == opt.epoch and opt2.lr == opt.lr
    assert opt.lr == pytest.approx(0.1 * 0.5 ** 4)


def test_snapshot_files_are_written_atomically(tmp_path):
    trainer = make_trainer(tmp_path, stop=(2, 'epoch'))
    trainer.extend(extensions.snapshot(filename='snap_{.updater.epoch}'))
    trainer.extend(extensions.snapshot_object(
        trainer.updater.get_optimizer().target, 'model_{.updater.iteration}'),
        trigger=(5, 'iteration'))
    trainer.run()
    assert sorted(os.listdir(str(tmp_path))) == ['model_10', 'model_5',
                                                 'snap_1', 'snap_2']
    model = make_model(seed=1)
    serializers.load_npz(str(tmp_path / 'model_10'), model)
    numpy.testing.assert_array_equal(
        model.predictor.l1.W.array,
        trainer.updater.get_optimizer().target.predictor.l1.W.array)
    loaded = make_model(seed=1)
    serializers.load_npz(str(tmp_path / 'snap_2'), loaded,
                         path='updater/model:main/')
    numpy.testing.assert_array_equal(loaded.predictor.l2.b.array,
                                     model.predictor.l2.b.array)


def test_failed_save_leaves_no_file(tmp_path):
    def savefun(path, obj):
        with open(path, 'w') as f:
            f.write('partial')
        raise OSError('disk full')

    trainer = make_trainer(tmp_path, stop=(1, 'epoch'))
    trainer.extend(extensions.snapshot(savefun=savefun))
    with pytest.raises(OSError, match='disk full'):
        trainer.run()
    assert os.listdir(str(tmp_path)) == []


def test_custom_savefun_receives_the_target(tmp_path):
    saved = []

    def savefun(path, obj):
        saved.append((os.path.basename(os.path.dirname(path)), obj))
        open(path, 'w').close()

    trainer = make_trainer(tmp_path / 'out', stop=(1, 'epoch'))
    trainer.extend(extensions.snapshot(savefun=savefun, target='thing',
                                       filename='sub/x'))
    trainer.run()
    assert saved == [('sub', 'thing')]
    assert (tmp_path / 'out' / 'sub' / 'x').is_file()


def test_condition_and_writer_as_chainer(tmp_path):
    # Chainer's snapshot(condition=, writer=): condition() decides at each
    # trigger; writer(name, out, arrays) writes the serialized target.
    written, asked = [], []

    def condition():
        asked.append(1)
        return len(asked) % 2 == 0   # every second epoch

    def writer(name, out, arrays):
        written.append((name, out, arrays['updater/iteration'].item()))
        serializers.save_npz(os.path.join(out, name), arrays)

    trainer = make_trainer(tmp_path, stop=(4, 'epoch'))
    trainer.extend(extensions.snapshot(condition=condition, writer=writer))
    trainer.run()
    assert len(asked) == 4
    assert written == [('snapshot_iter_10', str(tmp_path), 10),
                       ('snapshot_iter_20', str(tmp_path), 20)]
    again = make_trainer(tmp_path / 'again', stop=(4, 'epoch'))
    serializers.load_npz(str(tmp_path / 'snapshot_iter_20'), again)
    assert again.updater.iteration == 20
    with pytest.raises(TypeError, match='savefun or writer, not both'):
        extensions.snapshot(savefun=print, writer=writer)


def test_n_retains_keeps_the_newest_snapshots(tmp_path):
    trainer = make_trainer(tmp_path, stop=(4, 'epoch'))
    trainer.extend(extensions.snapshot(n_retains=2))
    trainer.extend(extensions.snapshot_object(
        trainer.updater.get_optimizer().target, 'model_{.updater.epoch}',
        n_retains=1))
    (tmp_path / 'snapshot_notes.txt').write_text('not a snapshot')
    trainer.run()
    assert sorted(os.listdir(str(tmp_path))) == [
        'model_4', 'snapshot_iter_15', 'snapshot_iter_20',
        'snapshot_notes.txt']
    with pytest.raises(ValueError, match='n_retains must be at least 1'):
        extensions.snapshot(n_retains=0)


def test_n_retains_with_a_writer(tmp_path):
    # Chainer's writers write the file themselves; n_retains still holds
    # (it was ignored: every snapshot stayed).
    def writer(name, out, arrays):
        serializers.save_npz(os.path.join(out, name), arrays)

    trainer = make_trainer(tmp_path, stop=(4, 'epoch'))
    trainer.extend(extensions.snapshot(n_retains=2, writer=writer))
    trainer.run()
    assert sorted(os.listdir(str(tmp_path))) == [
        'snapshot_iter_15', 'snapshot_iter_20']


def test_stale_temporaries_are_ours_by_name_and_dead_pid(tmp_path):
    from minichain.training.extensions._snapshot import stale_temporaries
    dead = 2 ** 22 + 17  # above Linux's default pid_max: never running
    names = ['.snapshot_iter_6.{}.tmp'.format(dead),  # Snapshot's
             '..snapshot_iter_6.{0}.tmp.{0}.0a1b2c3d.tmp'.format(dead),
             '.log.{}.deadbeef.tmp'.format(dead)]       # atomic_write's
    kept = ['.snapshot_iter_6.{}.tmp'.format(os.getppid()),  # still running
            '.other.{}.tmp'.format(dead),                   # not ours
            'snapshot_iter_6', '.snapshot_iter_6.tmp']
    for name in names + kept:
        (tmp_path / name).write_bytes(b'x')
    found = stale_temporaries(str(tmp_path), ['snapshot_iter_{.updater.'
                                              'iteration}', 'log'])
    assert found == sorted(str(tmp_path / n) for n in names)
    assert stale_temporaries(str(tmp_path / 'none'), ['log']) == []
