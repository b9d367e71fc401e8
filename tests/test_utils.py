"""minichain.utils: Chainer's chainer.utils helpers that programs call."""
import warnings

import numpy
import pytest

import minichain
from minichain import utils


def test_experimental_warns_unless_switched_off(monkeypatch):
    # (a ported example run in this process may have switched it off)
    monkeypatch.setattr(minichain, 'disable_experimental_feature_warning',
                        False)
    with pytest.warns(FutureWarning, match='send is experimental'):
        utils.experimental('send')
    monkeypatch.setattr(minichain, 'disable_experimental_feature_warning',
                        True)  # what ChainerMN's examples set
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # a warning would raise
        utils.experimental('send')


def test_size_of_shape_and_force_array():
    assert utils.size_of_shape(()) == 1
    assert utils.size_of_shape((2, 3, 4)) == 24
    a = utils.force_array(numpy.float32(2.5))
    assert isinstance(a, numpy.ndarray) and a.dtype == numpy.float32
    assert utils.force_array(numpy.ones(2), numpy.float32).dtype == \
        numpy.float32


def test_mixed16_is_a_dtype_name():
    assert repr(minichain.mixed16) == "dtype('mixed16')"
    assert numpy.dtype(minichain.mixed16) == numpy.float16
    with minichain.using_config('dtype', minichain.mixed16):
        assert minichain.get_dtype() == numpy.float16
        assert minichain.get_dtype(map_mixed16=numpy.float32) == \
            numpy.float32
