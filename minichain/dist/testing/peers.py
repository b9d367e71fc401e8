"""Which ``mpi`` marks are ours when another MPI plugin is installed too.

``pytest-mpi`` (``@pytest.mark.mpi(min_size=2)`` under ``mpirun -n 2
pytest --with-mpi``) and ``pytest-isolate-mpi`` (``@pytest.mark.mpi(ranks=2,
timeout=10, unit="s")``, each test forked as ``mpirun`` jobs) register a
marker named ``mpi`` as well. A project that uses one of them must keep
working when minichain (and so this plugin) is installed beside it, so the
rule is:

* ``@pytest.mark.minichain_mpi(ranks=[2, 3], timeout=...)`` is always ours;
  no peer knows that name.
* ``@pytest.mark.mpi(...)`` is ours while no peer is active.
* With pytest-isolate-mpi active, every ``mpi`` mark is its own: its marks
  look like ours (it takes ``ranks=`` and ``timeout=`` too), and it runs
  every test so marked. This plugin leaves those items alone: no
  parametrization, no relaunch, no report gathering.
* With pytest-mpi active, a bare mark and ``mpi(min_size=...)`` are its
  own; ``mpi(ranks=...)`` (a keyword it does not have) stays ours, under
  its rule that ``mpi`` tests run only with ``--with-mpi``.

Peers are found among the plugins pytest registered (entry points, ``-p``,
``pytest_plugins``), so ``-p no:pytest_mpi`` turns the rule off again.

A project whose ``mpi`` marks are all minichain's says so in its pytest
configuration, ``minichain_owns_mpi_mark = true`` (minichain's own
setup.cfg does): each ``mpi`` mark is then renamed ``minichain_mpi`` as
its test is collected, before any other plugin sees it, so that its tests
run under this plugin whatever else is installed, working or broken;
``-m mpi`` still selects them.
"""
import inspect
import re

import pytest

MARK = 'mpi'
OWN_MARK = 'minichain_mpi'
OWNS_INI = 'minichain_owns_mpi_mark'

# The top-level module of each peer -> its distribution's name.
PEERS = {'pytest_isolate_mpi': 'pytest-isolate-mpi', 'pytest_mpi': 'pytest-mpi'}

# Keywords only a peer's mark takes -> that peer.
_THEIR_KEYWORDS = {'unit': 'pytest-isolate-mpi',
                   'threads': 'pytest-isolate-mpi', 'min_size': 'pytest-mpi'}


def active_peer(config):
    """The distribution name of the MPI plugin registered beside ours in
    this session (``'pytest-mpi'``, ``'pytest-isolate-mpi'``), else None."""
    for name, plugin in config.pluginmanager.list_name_plugin():
        if plugin is None:  # blocked with -p no:NAME
            continue
        # A module registers under its entry point's name or its own; a
        # peer's hook object (registered at its configure) by its class's.
        module = getattr(plugin, '__name__', None) or type(plugin).__module__
        for candidate in (name, module):
            top = str(candidate).split('.')[0]
            if top in PEERS:
                return PEERS[top]
    return None


def _bare(mark):
    return not mark.args and not mark.kwargs


def our_mark(node):
    """The mark this plugin runs ``node`` by, or None: no mark, a bare
    label, or an ``mpi`` mark that belongs to an active peer. Raises
    TypeError naming the test for a mark nobody here can run."""
    mark = node.get_closest_marker(OWN_MARK)
    if mark is not None:
        return None if _bare(mark) else mark
    mark = node.get_closest_marker(MARK)
    if mark is None or _bare(mark):
        return None
    peer = active_peer(node.config)
    if peer is None:
        theirs = sorted(set(mark.kwargs) & set(_THEIR_KEYWORDS))
        if theirs:
            raise TypeError(
                '{}: @pytest.mark.mpi({}=...) is a mark of {}, which is not '
                'active in this session: install it, or mark the test '
                '@pytest.mark.mpi(ranks=[2, 3], timeout=seconds) for '
                'minichain.dist.testing.pytest_plugin'.format(
                    node.nodeid, theirs[0], _THEIR_KEYWORDS[theirs[0]]))
        return mark
    if peer == 'pytest-mpi' and 'ranks' in mark.kwargs and \
            'min_size' not in mark.kwargs:
        return mark
    return None


class Claim:
    """The hooks that make every ``mpi`` mark of the project this plugin's
    (registered when its configuration says ``minichain_owns_mpi_mark``):
    a mark is renamed before another plugin sees it, and ``-m`` follows."""

    def __init__(self, config):
        expr = config.option.markexpr or ''
        config.option.markexpr = re.sub(r'\bmpi\b(?!\s*\()', '({} or {})'
                                        .format(MARK, OWN_MARK), expr)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makeitem(self, collector, name, obj):
        """Before a test function or class becomes items: its marks, and
        those of its module or class (``pytestmark``)."""
        collector.own_markers[:] = _renamed(collector.own_markers)
        marks = getattr(obj, 'pytestmark', None) if (
            inspect.isfunction(obj) or inspect.isclass(obj)) else None
        if marks:
            obj.pytestmark = _renamed(marks if isinstance(marks, list)
                                      else [marks])

    def pytest_itemcollected(self, item):
        """The marks of a ``pytest.param(..., marks=...)``."""
        item.own_markers[:] = _renamed(item.own_markers)


def _renamed(marks):
    """``marks`` (Marks or MarkDecorators), each ``mpi`` one renamed."""
    out = []
    for mark in marks:
        mark = getattr(mark, 'mark', mark)
        if mark.name == MARK:
            mark = getattr(pytest.mark, OWN_MARK).with_args(
                *mark.args, **mark.kwargs).mark
        out.append(mark)
    return out
