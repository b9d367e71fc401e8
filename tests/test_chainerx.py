"""minichain.chainerx: the import line that replaces ``import chainerx``."""
import pickle

import numpy
import pytest

import minichain
from minichain import chainerx


def test_chainerx_is_not_available_and_no_device_uses_it():
    assert chainerx.is_available() is False
    assert minichain.get_device(-1).xp is not chainerx
    assert minichain.get_device('@numpy').xp is numpy


def test_ndarray_is_a_type_no_array_has():
    assert not isinstance(numpy.zeros(2), chainerx.ndarray)
    assert not isinstance(minichain.Variable(numpy.zeros(2)).array,
                          chainerx.ndarray)
    with pytest.raises(RuntimeError, match='ChainerX is not available'):
        chainerx.ndarray((2, 3))


def test_other_names_say_chainerx_is_not_part_of_minichain():
    with pytest.raises(AttributeError, match=r'minichain\.chainerx\.asarray: '
                       'ChainerX is not available in minichain'):
        chainerx.asarray
    assert not hasattr(chainerx, 'native')
    # Dunder probes (inspect, doctest) get a plain AttributeError.
    assert getattr(chainerx, '__wrapped__', None) is None
    assert pickle.loads(pickle.dumps(chainerx.is_available)) is \
        chainerx.is_available
