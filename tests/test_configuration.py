"""minichain.config: defaults, context managers, thread-locality."""
import threading

import numpy
import pytest

import minichain
from minichain import config, using_config


def test_defaults():
    assert config.enable_backprop is True
    assert config.train is True
    assert config.debug is False
    assert config.dtype == 'float32'
    assert 'enable_backprop' in config.show()


def test_using_config_sets_and_restores():
    with using_config('train', False):
        assert config.train is False
        with using_config('train', True):
            assert config.train is True
        assert config.train is False
    assert config.train is True


def test_using_config_restores_on_exception():
    with pytest.raises(KeyError):
        with using_config('debug', True):
            assert config.debug is True
            raise KeyError('boom')
    assert config.debug is False


def test_new_entries_are_removed_afterwards():
    with using_config('my_flag', 3):
        assert config.my_flag == 3
    with pytest.raises(AttributeError, match="no entry 'my_flag'.*train"):
        config.my_flag


def test_backprop_mode_context_managers():
    with minichain.no_backprop_mode():
        assert config.enable_backprop is False
        with minichain.force_backprop_mode():
            assert config.enable_backprop is True
        assert config.enable_backprop is False
    assert config.enable_backprop is True


def test_config_is_thread_local():
    seen = {}
    changed = threading.Event()
    checked = threading.Event()

    def worker():
        seen['train_in_thread'] = config.train  # defaults, not the caller's
        config.debug = True  # must not leak into the main thread
        changed.set()
        checked.wait(5)
        seen['debug_in_thread'] = config.debug

    with using_config('train', False):
        t = threading.Thread(target=worker)
        t.start()
        assert changed.wait(5)
        assert config.debug is False
        checked.set()
        t.join(5)
    assert seen == {'train_in_thread': True, 'debug_in_thread': True}


def test_get_dtype():
    assert minichain.get_dtype() == numpy.float32
    assert isinstance(minichain.get_dtype(), numpy.dtype)
    assert minichain.get_dtype('float16') == numpy.float16
    assert minichain.get_dtype(numpy.float64) == numpy.float64
    with using_config('dtype', 'float64'):
        assert minichain.get_dtype() == numpy.float64
    with using_config('dtype', 'mixed16'):  # Chainer's mixed precision name
        assert minichain.get_dtype() == numpy.float16
        assert minichain.get_dtype(map_mixed16=numpy.float32) == \
            numpy.float32
    with pytest.raises(TypeError):
        minichain.get_dtype('no-such-dtype')
