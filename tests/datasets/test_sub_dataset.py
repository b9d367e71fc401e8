import pytest

from minichain.datasets import SubDataset, split_dataset, split_dataset_random


def test_sub_dataset_range_and_order():
    data = list(range(10))
    sub = SubDataset(data, 2, 5)
    assert len(sub) == 3 and sub[:] == [2, 3, 4] and sub[-1] == 4
    order = list(reversed(range(10)))
    assert SubDataset(data, 0, 3, order)[:] == [9, 8, 7]
    with pytest.raises(IndexError):
        sub[3]


def test_sub_dataset_errors():
    with pytest.raises(ValueError, match='start <= finish'):
        SubDataset([1, 2], 1, 3)
    with pytest.raises(ValueError, match='order has shape'):
        SubDataset([1, 2], 0, 1, order=[0])


def test_split_dataset():
    a, b = split_dataset(list(range(5)), 2)
    assert a[:] == [0, 1] and b[:] == [2, 3, 4]
    with pytest.raises(ValueError, match='outside'):
        split_dataset([1], 2)


def test_split_dataset_random_is_a_seeded_partition():
    data = list(range(20))
    a, b = split_dataset_random(data, 7, seed=3)
    assert len(a) == 7 and len(b) == 13
    assert sorted(a[:] + b[:]) == data
    assert a[:] != list(range(7))  # shuffled
    c, _ = split_dataset_random(data, 7, seed=3)
    assert c[:] == a[:]
    d, _ = split_dataset_random(data, 7, seed=4)
    assert d[:] != a[:]
