"""Testing data-parallel code: the equivalence API and the pytest plugin.

* :mod:`~minichain.dist.testing.equivalence` -- the API users call in their
  own tests: ``assert_data_parallel_equivalent(make_model, x, t, comm)``
  (N ranks make exactly the update one process makes on the whole batch).
* :mod:`~minichain.dist.testing.pytest_plugin` (with ``relaunch`` and
  ``reports``) -- ``@pytest.mark.mpi(ranks=[2, 3])``: one test run as an
  MPI job per rank count from plain ``pytest``.
* ``get_device``, ChainerMN's ``chainermn.testing.get_device``.

A student reading how data parallelism works can skip this folder.

The names of ``equivalence`` are loaded on first access (PEP 562): the
plugin imports this package in every pytest session of an environment
that has minichain, and must not pull in the optimizers for that.
"""
import importlib

_EQUIVALENCE = ('assert_data_parallel_equivalent', 'NotEnoughRanksError',
                'require_ranks', 'default_lossfun')

__all__ = list(_EQUIVALENCE) + ['get_device']


def get_device(device_id=None, use_chainerx=False):
    """ChainerMN's ``chainermn.testing.get_device``: GPU ``device_id``
    (``'@cupy:N'``), or the host when None. minichain has no ChainerX:
    ``use_chainerx=True`` is a ValueError."""
    from minichain.device import get_device as device
    if use_chainerx:
        raise ValueError('get_device: minichain has no ChainerX '
                         '(use_chainerx=True)')
    return device('@numpy' if device_id is None else
                  '@cupy:{}'.format(device_id))


def __getattr__(name):
    if name in _EQUIVALENCE:
        module = importlib.import_module(__name__ + '.equivalence')
        return getattr(module, name)
    raise AttributeError('module {!r} has no attribute {!r}'.format(
        __name__, name))
