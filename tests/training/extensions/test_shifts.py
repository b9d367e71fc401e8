import math

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


# -- WarmupDecayShift ----------------------------------------------------------
def _values(shift, n):
    return [shift.value(i) for i in range(n)]


def test_warmup_then_cosine_linear_and_step():
    cosine = extensions.WarmupDecayShift('lr', 1.0, 6, warmup=2)
    assert _values(cosine, 8) == pytest.approx(
        [0.1, 0.55, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5,
         0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0, 0.0])
    linear = extensions.WarmupDecayShift('lr', 2.0, 4, decay='linear',
                                         start=0.0)
    assert _values(linear, 5) == pytest.approx([2.0, 1.5, 1.0, 0.5, 0.0])
    step = extensions.WarmupDecayShift('lr', 1.0, 9, warmup=1, decay='step')
    assert _values(step, 10) == pytest.approx(
        [0.1, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001])
    custom = extensions.WarmupDecayShift('lr', 1.0, 10, decay='step',
                                         steps=(0.5,), rate=0.5)
    assert _values(custom, 7)[4:] == [1.0, 0.5, 0.5]


def test_warmup_decay_sets_each_update_and_resumes_bit_for_bit(tmp_path):
    def run(stop, state=None):
        trainer = make_trainer(tmp_path, stop=(stop, 'iteration'))
        trainer.extend(extensions.WarmupDecayShift('lr', 0.3, 10, warmup=3))
        seen = []  # the rate of each update, read before the shift runs
        trainer.extend(lambda t: seen.append(t.updater.get_optimizer().lr),
                       name='rec', priority=1000)
        if state is not None:
            NpzDeserializer(state).load(trainer)
        trainer.run()
        saver = DictionarySerializer()
        saver.save(trainer)
        return seen, saver.target
    whole, _ = run(10)
    shift = extensions.WarmupDecayShift('lr', 0.3, 10, warmup=3)
    assert whole == _values(shift, 10)  # the first update used value(0)
    first, state = run(4)
    second, _ = run(10, state)
    assert first + second == whole  # exact floats, not approximately
    assert not [k for k in state if k.startswith('extensions/')
                and 'WarmupDecayShift' in k]  # nothing stored


def test_warmup_decay_bad_arguments():
    with pytest.raises(ValueError, match="decay must be one of cosine, "
                       "linear, step, got 'exp'"):
        extensions.WarmupDecayShift('lr', 0.1, 10, decay='exp')
    with pytest.raises(ValueError, match='total must be a whole number of '
                       'iterations, at least 1, got 0'):
        extensions.WarmupDecayShift('lr', 0.1, 0)
    with pytest.raises(ValueError, match='warmup must be a whole number'):
        extensions.WarmupDecayShift('lr', 0.1, 10, warmup=2.5)
