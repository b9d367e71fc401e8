from minichain.serializers import DictionarySerializer, NpzDeserializer
from minichain.training.triggers import MaxValueTrigger, MinValueTrigger
from tests.training._util import FakeTrainer


def _feed(trigger, values_per_interval):
    """Each interval: 2 iterations; the trigger sees the mean."""
    trainer = FakeTrainer()
    fired = []
    iteration = 0
    for a, b in values_per_interval:
        for value in (a, b):
            iteration += 1
            trainer.step(iteration, 0.0, 0.0)
            trainer.observation = {'v': value}
            result = trigger(trainer)
        fired.append(result)
    return fired


def test_min_and_max_value_triggers():
    intervals = [(4, 2), (1, 1), (3, 3), (0, 1)]  # means 3, 1, 3, 0.5
    assert _feed(MinValueTrigger('v', (2, 'iteration')), intervals) == [
        True, True, False, True]
    assert _feed(MaxValueTrigger('v', (2, 'iteration')), intervals) == [
        True, False, False, False]


def test_missing_key_never_fires():
    assert _feed(MinValueTrigger('w', (2, 'iteration')), [(1, 2)]) == [False]


def test_best_value_is_serialized():
    trigger = MinValueTrigger('v', (2, 'iteration'))
    _feed(trigger, [(2, 2)])
    saver = DictionarySerializer()
    trigger.serialize(saver)
    resumed = MinValueTrigger('v', (2, 'iteration'))
    resumed.serialize(NpzDeserializer(saver.target))
    assert resumed.best_value == 2.0
    assert _feed(resumed, [(3, 3), (1, 1)]) == [False, True]
