import pytest

from minichain.serializers import DictionarySerializer, NpzDeserializer
from minichain.training import extensions
from tests.training._util import make_trainer


def _record(trainer, values, attr='lr'):
    opt = trainer.updater.get_optimizer()
    trainer.extend(lambda t: values.append(getattr(opt, attr)),
                   name='rec', priority=-1)


def test_exponential_shift_per_iteration_with_target(tmp_path):
    trainer = make_trainer(tmp_path, stop=(5, 'iteration'), lr=0.8)
    trainer.extend(extensions.ExponentialShift('lr', 0.5, target=0.15))
    values = []
    _record(trainer, values)
    trainer.run()
    assert values == pytest.approx([0.4, 0.2, 0.15, 0.15, 0.15])


def test_exponential_shift_init_and_growth(tmp_path):
    trainer = make_trainer(tmp_path, stop=(3, 'iteration'), lr=0.8)
    trainer.extend(extensions.ExponentialShift('lr', 2.0, init=0.1,
                                               target=0.3))
    values = []
    _record(trainer, values)
    trainer.run()
    assert values == pytest.approx([0.2, 0.3, 0.3])


def test_exponential_shift_every_epoch(tmp_path):
    trainer = make_trainer(tmp_path, stop=(3, 'epoch'), lr=1.0)
    trainer.extend(extensions.ExponentialShift('lr', 0.1),
                   trigger=(1, 'epoch'))
    trainer.run()
    assert trainer.updater.get_optimizer().lr == pytest.approx(1e-3)


def test_linear_shift_warm_up(tmp_path):
    trainer = make_trainer(tmp_path, stop=(6, 'iteration'))
    trainer.extend(extensions.LinearShift('lr', (0.0, 0.4), (1, 5)))
    values = []
    _record(trainer, values)
    trainer.run()
    assert values == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.4])


def test_linear_shift_sets_the_start_value_before_training(tmp_path):
    trainer = make_trainer(tmp_path, stop=(1, 'iteration'), lr=0.5)
    seen = []
    trainer.extend(lambda t: seen.append(t.updater.get_optimizer().lr),
                   name='rec', priority=1000)
    trainer.extend(extensions.LinearShift('lr', (0.01, 0.1), (0, 10)))
    trainer.run()
    assert seen == [0.01]  # the first update already used the start value


def test_shift_state_is_serialized():
    shift = extensions.ExponentialShift('lr', 0.5, init=1.0)
    shift._t, shift._last_value = 3, 0.125
    saver = DictionarySerializer()
    shift.serialize(saver)
    fresh = extensions.ExponentialShift('lr', 0.5, init=1.0)
    fresh.serialize(NpzDeserializer(saver.target))
    assert fresh._t == 3 and fresh._last_value == 0.125
    empty = DictionarySerializer()
    extensions.LinearShift('lr', (0, 1), (0, 2)).serialize(empty)
    assert set(empty.target) == {'_t'}  # no value yet: nothing stored


def test_bad_arguments():
    with pytest.raises(ValueError, match='rate must be positive'):
        extensions.ExponentialShift('lr', 0)
    with pytest.raises(ValueError, match='t1 < t2'):
        extensions.LinearShift('lr', (0, 1), (5, 5))


def test_explicit_optimizer_and_attribute(tmp_path):
    trainer = make_trainer(tmp_path, stop=(2, 'iteration'))
    opt = trainer.updater.get_optimizer()
    trainer.extend(extensions.ExponentialShift('momentum', 0.5,
                                               optimizer=opt))
    trainer.run()
    assert opt.momentum == pytest.approx(0.9 * 0.25)
