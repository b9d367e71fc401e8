import numpy
import pytest

from minichain import iterators, serializers, training
from minichain.training import extension, extensions
from tests.training._util import make_data, make_trainer


def test_stops_at_iterations_and_epochs(tmp_path):
    trainer = make_trainer(tmp_path / 'a', stop=(7, 'iteration'))
    trainer.run()
    assert trainer.updater.iteration == 7
    assert (tmp_path / 'a').is_dir()
    trainer = make_trainer(tmp_path / 'b', stop=(2, 'epoch'))
    trainer.run()
    # 24 examples in batches of 5: epoch 2 ends inside the 10th batch
    assert trainer.updater.iteration == 10 and trainer.updater.epoch == 2


def test_observation_holds_the_reported_loss(tmp_path):
    seen = []
    trainer = make_trainer(tmp_path, stop=(2, 'iteration'))
    trainer.extend(lambda t: seen.append(dict(t.observation)), name='spy')
    trainer.run()
    assert len(seen) == 2
    assert set(seen[0]) == {'main/loss', 'main/accuracy'}
    assert trainer.observation is not seen[1]  # a fresh dict each time


def test_priority_order_triggers_and_names(tmp_path):
    order = []

    class Ext(training.Extension):
        def __init__(self, tag):
            self.tag = tag

        def __call__(self, trainer):
            order.append((trainer.updater.iteration, self.tag))

    trainer = make_trainer(tmp_path, stop=(4, 'iteration'))
    trainer.extend(Ext('reader'))
    trainer.extend(Ext('writer'), priority=extension.PRIORITY_WRITER)
    trainer.extend(Ext('every2'), trigger=(2, 'iteration'), priority=150)
    trainer.extend(Ext('named'), name='custom')
    names = list(trainer._extensions)
    assert names == ['Ext', 'Ext_1', 'Ext_2', 'custom']
    assert trainer.get_extension('Ext_1').tag == 'writer'
    assert trainer.get_extension('custom').name == 'custom'
    trainer.run()
    assert order[:4] == [(1, 'writer'), (1, 'reader'), (1, 'named'),
                         (2, 'writer')]
    assert order[4:7] == [(2, 'every2'), (2, 'reader'), (2, 'named')]
    with pytest.raises(KeyError, match="no extension named 'nope'"):
        trainer.get_extension('nope')


def test_make_extension_defaults_and_lifecycle(tmp_path):
    events = []

    @training.make_extension(trigger=(2, 'iteration'), priority=7,
                             initializer=lambda t: events.append('init'),
                             finalizer=lambda: events.append('final'))
    def tick(trainer):
        events.append(trainer.updater.iteration)

    assert tick.default_name == 'tick' and tick.priority == 7
    trainer = make_trainer(tmp_path, stop=(5, 'iteration'))
    trainer.extend(tick)
    trainer.run()
    assert events == ['init', 2, 4, 'final']
    with pytest.raises(RuntimeError, match='already run'):
        trainer.run()
    with pytest.raises(RuntimeError, match='after run'):
        trainer.extend(tick)


def test_finalize_runs_when_training_fails(tmp_path):
    events = []

    class Boom(training.Extension):
        def __call__(self, trainer):
            raise RuntimeError('boom')

        def finalize(self):
            events.append('finalized')

    trainer = make_trainer(tmp_path, stop=(5, 'iteration'))
    trainer.extend(Boom())
    with pytest.raises(RuntimeError, match='boom'):
        trainer.run()
    assert events == ['finalized']


def test_extend_rejects_non_callables(tmp_path):
    trainer = make_trainer(tmp_path)
    with pytest.raises(TypeError, match='callable'):
        trainer.extend(3)
    with pytest.raises(TypeError, match='period, unit'):
        trainer.extend(lambda t: None, trigger='epoch')


def test_elapsed_time_and_serialized_keys(tmp_path):
    trainer = make_trainer(tmp_path, stop=(3, 'iteration'))
    assert trainer.elapsed_time == 0.0
    trainer.run()
    elapsed = trainer.elapsed_time
    assert elapsed > 0 and trainer.elapsed_time == elapsed  # frozen
    saver = serializers.DictionarySerializer()
    saver.save(trainer)
    assert float(saver.target['_snapshot_elapsed_time']) == elapsed
    assert 'updater/iteration' in saver.target
    fresh = make_trainer(tmp_path, stop=(3, 'iteration'))
    serializers.NpzDeserializer(saver.target).load(fresh)
    assert fresh.elapsed_time == pytest.approx(elapsed)
    assert fresh.updater.iteration == 3
    numpy.testing.assert_array_equal(
        fresh.updater.get_optimizer().target.predictor.l1.b.array,
        trainer.updater.get_optimizer().target.predictor.l1.b.array)


# -- call_before_training -----------------------------------------------------
def _recorder(calls, name, **attrs):
    def ext(trainer):
        calls.append((name, trainer.updater.iteration,
                      trainer.is_before_training))
    ext.__name__ = name
    for key, value in attrs.items():
        setattr(ext, key, value)
    return ext


def test_call_before_training_runs_once_before_the_first_update(tmp_path):
    calls = []
    trainer = make_trainer(tmp_path, stop=(2, 'iteration'))
    trainer.extend(_recorder(calls, 'early'), call_before_training=True)
    trainer.extend(_recorder(calls, 'plain'))
    trainer.extend(_recorder(calls, 'by_attribute',
                             call_before_training=True, priority=1000))
    assert trainer.is_before_training
    trainer.run()
    # Before training, in priority order; then after every update.
    assert calls == [('by_attribute', 0, True), ('early', 0, True),
                     ('by_attribute', 1, False), ('early', 1, False),
                     ('plain', 1, False), ('by_attribute', 2, False),
                     ('early', 2, False), ('plain', 2, False)]
    assert not extension.Extension.call_before_training


def test_call_before_training_logs_epoch_zero_and_not_after_resume(tmp_path):
    def build(out, stop):
        trainer = make_trainer(out, stop=stop)
        test_iter = iterators.SerialIterator(make_data(10, seed=1), 5,
                                             repeat=False, shuffle=False)
        model = trainer.updater.get_optimizer().target
        trainer.extend(extensions.Evaluator(test_iter, model),
                       call_before_training=True)
        trainer.extend(extensions.LogReport(), call_before_training=True)
        trainer.extend(extensions.snapshot(), trigger=(1, 'epoch'))
        return trainer

    first = build(tmp_path / 'a', (1, 'epoch'))
    first.run()
    log = first.get_extension('LogReport').log
    assert [(e['epoch'], e['iteration']) for e in log] == [(0, 0), (1, 5)]
    assert 'validation/main/loss' in log[0] and 'main/loss' not in log[0]
    second = build(tmp_path / 'a', (2, 'epoch'))
    serializers.load_npz(str(tmp_path / 'a' / 'snapshot_iter_5'), second)
    second.run()
    log = second.get_extension('LogReport').log
    assert [(e['epoch'], e['iteration']) for e in log] == [
        (0, 0), (1, 5), (2, 10)]


# -- loading into a trainer with fewer extensions -----------------------------
class _CountingTrigger:
    """Fires every iteration and keeps a count in snapshots."""

    def __init__(self):
        self.count = 0

    def __call__(self, trainer):
        self.count += 1
        return True

    def serialize(self, serializer):
        self.count = int(serializer('count', self.count))


def test_load_skips_extensions_this_trainer_lacks_as_chainer_does(tmp_path):
    """Rank 0 of a ChainerMN script has LogReport and more; the other
    ranks load its snapshot into trainers without them."""
    full = make_trainer(tmp_path, stop=(4, 'iteration'))
    full.extend(extensions.LogReport(trigger=(2, 'iteration')),
                trigger=_CountingTrigger())
    full.run()
    path = str(tmp_path / 'snap')
    serializers.save_npz(path, full)
    with numpy.load(path) as npz:
        assert any(k.startswith('extensions/LogReport/') for k in npz)
        assert any(k.startswith('extension_triggers/LogReport/')
                   for k in npz)
    bare = make_trainer(tmp_path, stop=(4, 'iteration'))
    serializers.load_npz(path, bare)
    assert bare.updater.iteration == 4
    # The extensions it has must still read every key of theirs.
    other = make_trainer(tmp_path, stop=(4, 'iteration'))
    trigger = _CountingTrigger()
    other.extend(extensions.LogReport(trigger=(2, 'iteration')),
                 trigger=trigger)
    serializers.load_npz(path, other)
    assert other.get_extension('LogReport').log == \
        full.get_extension('LogReport').log
    assert trigger.count == 4
    with numpy.load(path) as npz:
        extra = dict(npz)
    extra['extensions/LogReport/surprise'] = numpy.zeros(1)
    extra['updater/surprise'] = numpy.zeros(1)
    numpy.savez(str(tmp_path / 'extra.npz'), **extra)
    wrong = make_trainer(tmp_path, stop=(4, 'iteration'))
    wrong.extend(extensions.LogReport(trigger=(2, 'iteration')),
                 trigger=_CountingTrigger())
    with pytest.raises(ValueError, match="did not read: "
                       "'extensions/LogReport/surprise', 'updater/surprise'"):
        serializers.load_npz(str(tmp_path / 'extra.npz'), wrong)
