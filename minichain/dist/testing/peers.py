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
"""
MARK = 'mpi'
OWN_MARK = 'minichain_mpi'

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
