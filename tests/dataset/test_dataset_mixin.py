import numpy
import pytest

from minichain.dataset import DatasetMixin


class Squares(DatasetMixin):
    def __len__(self):
        return 5

    def get_example(self, i):
        return i * i


def test_int_slice_and_list_indexing():
    d = Squares()
    assert d[2] == 4 and d[-1] == 16
    assert d[1:4] == [1, 4, 9]
    assert d[::-2] == [16, 4, 0]
    assert d[[0, 3]] == [0, 9]
    assert d[numpy.array([4, 1])] == [16, 1]


def test_out_of_range_and_bad_index():
    with pytest.raises(IndexError, match='out of range'):
        Squares()[5]
    with pytest.raises(TypeError, match='index must be'):
        Squares()['a']
