import numpy
import pytest

from minichain import serializers, training
from minichain.training import extension
from tests.training._util import make_trainer


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
