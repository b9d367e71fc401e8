"""Sequential: links and plain callables called in turn."""
import numpy
import pytest

import minichain
from minichain import functions as F
from tests.test_link import Scale


def test_sequential_links_and_callables():
    seq = minichain.Sequential(Scale(3), F.relu, lambda x: x * 2.0,
                               Scale(3))
    assert len(seq) == 4 and seq[1] is F.relu
    assert [p for p, _ in seq.namedparams()] == ['/0/s', '/0/t', '/1/s',
                                                 '/1/t']
    seq[0].t.array[...] = [-10, 0, 1]
    x = numpy.array([[1.0, 2.0, 3.0]], dtype=numpy.float32)
    y = seq(x)
    expected = numpy.maximum(x * 2 + [-10, 0, 1], 0) * 2 * 2
    numpy.testing.assert_allclose(y.array, expected)
    assert 'relu' in repr(seq)
    with pytest.raises(TypeError, match='Link or a callable'):
        minichain.Sequential(3)


def test_sequential_is_reachable_from_links_as_readme_lists_it():
    from minichain import links as L
    assert L.Sequential is minichain.Sequential
