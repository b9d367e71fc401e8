import pytest

from minichain.training.triggers import ManualScheduleTrigger
from tests.training._util import FakeTrainer


def test_iteration_points():
    trigger = ManualScheduleTrigger([5, 2], 'iteration')
    fired = [i for i in range(1, 8) if trigger(FakeTrainer(iteration=i))]
    assert fired == [2, 5] and trigger.finished


def test_epoch_points():
    trigger = ManualScheduleTrigger(1.5, 'epoch')
    assert not trigger(FakeTrainer(epoch_detail=0.2, previous=None))
    assert not trigger(FakeTrainer(epoch_detail=1.4, previous=1.0))
    assert not trigger.finished
    assert trigger(FakeTrainer(epoch_detail=1.6, previous=1.4))
    assert trigger.finished
    assert not trigger(FakeTrainer(epoch_detail=2.0, previous=1.6))


def test_errors():
    with pytest.raises(ValueError, match='empty'):
        ManualScheduleTrigger([], 'epoch')
    with pytest.raises(ValueError, match='unit'):
        ManualScheduleTrigger([1], 'step')
