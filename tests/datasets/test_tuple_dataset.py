import numpy
import pytest

from minichain.datasets import TupleDataset


def test_tuple_dataset_indexing():
    x = numpy.arange(10).reshape(5, 2)
    t = numpy.arange(5) * 10
    d = TupleDataset(x, t)
    assert len(d) == 5
    a, b = d[2]
    numpy.testing.assert_array_equal(a, [4, 5])
    assert b == 20
    batch = d[1:3]
    assert len(batch) == 2 and batch[1][1] == 20
    assert [ex[1] for ex in d[[4, 0]]] == [40, 0]
    assert d.datasets[0] is x


def test_tuple_dataset_errors():
    with pytest.raises(ValueError, match=r'different lengths \[3, 2\]'):
        TupleDataset([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match='at least one'):
        TupleDataset()
