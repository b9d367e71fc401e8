"""Stands in for ``chainerx`` in ported scripts: ChainerX is not available.

ChainerX is Chainer's C++ array backend. minichain has none (its arrays are
NumPy's and CuPy's), so this module is what Chainer's own ``chainerx``
package is in a Chainer built without it: ``is_available()`` is False, and
``ndarray`` is a class that no array is an instance of. A script written for
Chainer changes its import line only::

    import chainerx                  # Chainer
    from minichain import chainerx   # minichain

and its checks keep working: ``device.xp is not chainerx`` is True for every
minichain device, ``isinstance(x, chainerx.ndarray)`` is False. Any other
name raises an AttributeError saying that ChainerX is not part of minichain.
"""

__all__ = ['is_available', 'ndarray']


def is_available():
    """False: minichain has no ChainerX backend."""
    return False


class ndarray:
    """A type no array has (for ``isinstance`` checks); it cannot be made."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError('chainerx.ndarray: ChainerX is not available in '
                           'minichain; use NumPy or CuPy arrays')


def __getattr__(name):
    if name.startswith('__'):  # copy, pickle and inspect probe these
        raise AttributeError(name)
    raise AttributeError(
        'minichain.chainerx.{}: ChainerX is not available in minichain (only '
        'is_available() and ndarray are here); use NumPy/CuPy arrays and '
        "devices from minichain.get_device ('@numpy', '@cupy:N')".format(name))
