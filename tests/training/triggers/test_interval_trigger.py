import pytest

from minichain.training import get_trigger
from minichain.training.triggers import IntervalTrigger
from tests.training._util import FakeTrainer


def test_iteration_unit_fires_on_multiples_only():
    trigger = IntervalTrigger(3, 'iteration')
    fired = []
    for i in range(0, 10):
        fired.append(trigger(FakeTrainer(iteration=i)))
    assert [i for i, f in enumerate(fired) if f] == [3, 6, 9]
    assert trigger.get_training_length() == (3, 'iteration')


def test_epoch_unit_fires_when_crossing_a_multiple():
    trigger = IntervalTrigger(1, 'epoch')
    assert not trigger(FakeTrainer(epoch_detail=0.0, previous=None))
    assert not trigger(FakeTrainer(epoch_detail=0.8, previous=0.4))
    assert trigger(FakeTrainer(epoch_detail=1.2, previous=0.8))
    assert trigger(FakeTrainer(epoch_detail=2.0, previous=1.6))
    assert not trigger(FakeTrainer(epoch_detail=2.4, previous=2.0))
    half = IntervalTrigger(0.5, 'epoch')
    assert half(FakeTrainer(epoch_detail=0.6, previous=0.3))
    assert not half(FakeTrainer(epoch_detail=0.9, previous=0.6))
    two = IntervalTrigger(2, 'epoch')
    assert not two(FakeTrainer(epoch_detail=1.2, previous=0.8))
    assert two(FakeTrainer(epoch_detail=2.2, previous=1.8))


@pytest.mark.parametrize('args, match', [
    ((1, 'epochs'), "unit must be 'epoch' or 'iteration'"),
    ((0, 'epoch'), 'positive number'),
    ((-1, 'iteration'), 'positive number'),
    ((1.5, 'iteration'), 'must be an integer'),
])
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        IntervalTrigger(*args)


def test_get_trigger():
    trigger = get_trigger((2, 'iteration'))
    assert isinstance(trigger, IntervalTrigger) and trigger.period == 2

    def custom(trainer):
        return True

    assert get_trigger(custom) is custom
    assert get_trigger(None)(FakeTrainer(iteration=5)) is False
    with pytest.raises(TypeError, match=r'\(period, unit\)'):
        get_trigger(5)
