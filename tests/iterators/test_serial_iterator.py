import numpy
import pytest

from minichain import serializers
from minichain.iterators import SerialIterator


def test_in_order_with_epoch_bookkeeping():
    it = SerialIterator(list(range(5)), 2, shuffle=False)
    assert it.epoch == 0 and not it.is_new_epoch
    assert it.epoch_detail == 0 and it.previous_epoch_detail is None
    assert next(it) == [0, 1]
    assert it.epoch_detail == pytest.approx(0.4)
    assert it.previous_epoch_detail == 0
    assert next(it) == [2, 3] and not it.is_new_epoch
    assert next(it) == [4, 0]  # crosses into epoch 1
    assert it.epoch == 1 and it.is_new_epoch
    assert it.epoch_detail == pytest.approx(1.2)
    assert it.previous_epoch_detail == pytest.approx(0.8)
    assert next(it) == [1, 2] and not it.is_new_epoch


def test_exact_epoch_end_and_large_batches():
    it = SerialIterator(list(range(4)), 2, shuffle=False)
    next(it)
    next(it)
    assert it.is_new_epoch and it.epoch == 1 and it.current_position == 0
    big = SerialIterator(list(range(3)), 7, shuffle=False)
    assert next(big) == [0, 1, 2, 0, 1, 2, 0]
    assert big.epoch == 2 and big.epoch_detail == pytest.approx(2 + 1 / 3)


def test_no_repeat_stops_after_one_epoch_and_resets():
    it = SerialIterator(list(range(5)), 2, repeat=False, shuffle=False)
    assert list(it) == [[0, 1], [2, 3], [4]]
    assert it.is_new_epoch and it.epoch == 1
    with pytest.raises(StopIteration):
        next(it)
    it.reset()
    assert it.epoch == 0 and next(it) == [0, 1]


def _epochs(it, n_batches):
    return [next(it) for _ in range(n_batches)]


def test_shuffle_is_a_permutation_per_epoch_and_reproducible():
    data = list(range(10))
    it = SerialIterator(data, 5, seed=42)
    batches = _epochs(it, 6)
    epochs = [batches[i] + batches[i + 1] for i in (0, 2, 4)]
    for order in epochs:
        assert sorted(order) == data
    assert epochs[0] != epochs[1] and epochs[0] != data
    assert _epochs(SerialIterator(data, 5, seed=42), 6) == batches
    assert _epochs(SerialIterator(data, 5, seed=43), 6) != batches
    assert SerialIterator(data, 5, seed=1).shuffle
    # reset restarts the same sequence
    it.reset()
    assert _epochs(it, 6) == batches


def test_unseeded_iterators_differ():
    data = list(range(50))
    assert next(SerialIterator(data, 50)) != next(SerialIterator(data, 50))


@pytest.mark.parametrize('shuffle', [True, False])
def test_resume_continues_the_same_sequence(tmp_path, shuffle):
    data = list(range(7))
    reference = _epochs(SerialIterator(data, 3, shuffle=shuffle, seed=5), 9)
    it = SerialIterator(data, 3, shuffle=shuffle, seed=5)
    first = _epochs(it, 4)
    path = str(tmp_path / 'it.npz')
    serializers.save_npz(path, it)
    resumed = SerialIterator(data, 3, shuffle=shuffle)  # another seed
    serializers.load_npz(path, resumed)
    assert resumed.epoch == it.epoch and resumed.is_new_epoch == \
        it.is_new_epoch
    assert resumed.epoch_detail == it.epoch_detail
    assert resumed.previous_epoch_detail == it.previous_epoch_detail
    assert first + _epochs(resumed, 5) == reference


def test_snapshot_keys():
    it = SerialIterator(list(range(4)), 3, seed=0)
    next(it)
    saver = serializers.DictionarySerializer()
    saver.save(it)
    assert set(saver.target) == {'current_position', 'epoch', 'is_new_epoch',
                                 'seed', 'order', 'previous_epoch_detail'}
    numpy.testing.assert_array_equal(numpy.sort(saver.target['order']),
                                     numpy.arange(4))


def test_errors():
    with pytest.raises(ValueError, match='batch_size must be a positive'):
        SerialIterator([1], 0)
    with pytest.raises(ValueError, match='batch_size'):
        SerialIterator([1], 2.0)
    with pytest.raises(ValueError, match='dataset is empty'):
        next(SerialIterator([], 2, shuffle=False))
