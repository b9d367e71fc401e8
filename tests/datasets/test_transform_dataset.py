import pytest

from minichain.datasets import TransformDataset, TupleDataset


def test_transform_applies_on_access():
    calls = []

    def double(example):
        calls.append(example)
        x, t = example
        return 2 * x, t

    d = TransformDataset(TupleDataset([1, 2, 3], [0, 1, 0]), double)
    assert len(d) == 3 and calls == []
    assert d[1] == (4, 1)
    assert d[0:2] == [(2, 0), (4, 1)]
    assert len(calls) == 3


def test_transform_must_be_callable():
    with pytest.raises(TypeError, match='callable'):
        TransformDataset([1], 5)
