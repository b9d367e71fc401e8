import pytest

from minichain import training
from minichain.training import extension


def test_extension_defaults():
    class Mine(training.Extension):
        def __call__(self, trainer):
            pass

    ext = Mine()
    assert ext.trigger == (1, 'iteration')
    assert ext.priority == extension.PRIORITY_READER
    assert ext.default_name == 'Mine' and ext.name is None
    ext.initialize(None)
    ext.finalize()
    ext.serialize(None)
    with pytest.raises(NotImplementedError):
        training.Extension()(None)


def test_priorities_are_ordered():
    assert (extension.PRIORITY_WRITER > extension.PRIORITY_EDITOR
            > extension.PRIORITY_READER > extension.PRIORITY_SNAPSHOT)


def test_make_extension_plain_defaults():
    @training.make_extension()
    def f(trainer):
        pass

    assert f.trigger == (1, 'iteration')
    assert f.priority == extension.PRIORITY_READER
    assert f.default_name == 'f'
    assert not hasattr(f, 'initialize') and not hasattr(f, 'finalize')
