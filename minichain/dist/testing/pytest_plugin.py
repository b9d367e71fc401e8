"""pytest plugin: ``@pytest.mark.mpi(ranks=[2, 3])`` runs a test on N ranks.

Installed with minichain (a ``pytest11`` entry point), so it is active in
every project where minichain is installed. A marked test is collected once
per rank count, with ids ending in ``[ranks=2]``, ``[ranks=3]`` (the
``mpi_ranks`` fixture gives the count). What an item does depends on where
pytest runs:

* **plain** ``pytest``: the item runs just that test under ``mpiexec -n k``
  (:func:`minichain.dist.launcher.mpiexec_command`: ``$MINICHAIN_MPIEXEC``
  chooses the launcher), ended after ``timeout`` seconds (default 300).
  Every rank writes its outcome to a file; the item passes only if every
  rank passed, and a failure is reported once: which ranks failed, in which
  phase, their report (ranks with the same report shown together), which
  passed, and where a rank that did not finish was. No ``mpiexec``: the item
  fails saying what to install.
* **inside an MPI job you started** (``mpiexec -n k python -m pytest``):
  marked tests run in place (an item for another rank count is skipped,
  saying why), and rank 0 alone reports: after each phase of every test the
  other ranks send it their outcome (over a duplicate of ``COMM_WORLD``, so
  MPI starts with the session) and stay silent.

After a rank fails, the others get ``min(10, timeout / 10)`` seconds to
finish the same phase; ranks still running then are most likely waiting for
the failed one in a collective, and the job is ended (``MPI_Abort``) instead
of hanging until the timeout. A relaunched job also gets the stall watchdog
``MINICHAIN_STALL_TIMEOUT`` below the timeout and ``OMP_NUM_THREADS`` (and
the OpenBLAS/MKL ones) = cores / k, unless they are set already.

A bare ``@pytest.mark.mpi`` (no arguments) only labels a test that starts
MPI itself; ``-m "not mpi"`` deselects both kinds. Turn the plugin off with
``-p no:minichain.dist.testing.pytest_plugin``.

``@pytest.mark.minichain_mpi(ranks=..., timeout=...)`` is the same mark under
a name no other plugin has. While ``pytest-isolate-mpi`` is active, ``mpi``
marks are its own, beside ``pytest-mpi`` only ``mpi(ranks=...)`` ones stay
ours, unless the project sets ``minichain_owns_mpi_mark = true``
(:mod:`.peers`). With either, a job the user started reports from every rank.
"""
import faulthandler
import os
import sys
import time

import pytest

from minichain.dist.testing import peers
from minichain.dist.testing import reports
from minichain.dist.testing import relaunch
from minichain.dist import shm_files
from minichain.dist.mpi import TAG_TEST_ACK, TAG_TEST_RECORD

DEFAULT_TIMEOUT = 300.0
_STATE = pytest.StashKey()
_SKIP = pytest.StashKey()


def grace_for(timeout):
    """Seconds the other ranks get to finish a phase after one fails."""
    return min(10.0, max(1.0, timeout / 10))


class MpiSpec:
    """What ``@pytest.mark.mpi(ranks=..., timeout=...)`` asks for."""

    def __init__(self, ranks, timeout):
        self.ranks, self.timeout = ranks, timeout
        self.grace = grace_for(timeout)


def mpi_spec(node):
    """The MpiSpec of a test (its closest ``mpi`` or ``minichain_mpi``
    mark, see :mod:`.peers`), or None when it has none, a bare one, or one
    an active peer plugin owns. Raises TypeError naming the test for a bad
    mark."""
    mark = peers.our_mark(node)
    if mark is None:
        return None
    where = '{}: @pytest.mark.{}'.format(node.nodeid, mark.name)
    if mark.args or set(mark.kwargs) - {'ranks', 'timeout'}:
        raise TypeError('{} takes ranks=[...] and timeout=seconds only, got '
                        'args {} and keywords {}'.format(
                            where, mark.args, sorted(mark.kwargs)))
    ranks = mark.kwargs.get('ranks')
    ranks = [ranks] if isinstance(ranks, int) else ranks
    if not ranks or not all(isinstance(k, int) and k >= 1 for k in ranks):
        raise TypeError('{}: ranks must be a non-empty list of rank counts '
                        '>= 1, got {!r}'.format(where, mark.kwargs.get(
                            'ranks')))
    timeout = mark.kwargs.get('timeout', DEFAULT_TIMEOUT)
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise TypeError('{}: timeout must be a positive number of seconds, '
                        'got {!r}'.format(where, timeout))
    return MpiSpec(list(dict.fromkeys(ranks)), float(timeout))


def ranks_of(item):
    """The rank count of an item of a test marked for this plugin, else
    None (also for an item a peer plugin parametrized)."""
    callspec = getattr(item, 'callspec', None)
    if callspec is None or 'mpi_ranks' not in callspec.params or \
            peers.our_mark(item) is None:
        return None
    return callspec.params['mpi_ranks']


@pytest.fixture
def mpi_ranks(request):
    """The rank count of this item of an ``mpi(ranks=[...])`` test."""
    if not hasattr(request, 'param'):
        if peers.active_peer(request.config) == 'pytest-isolate-mpi':
            # It has an autouse fixture of this name, which gives 1 to a
            # test it did not parametrize; whichever of the two pytest
            # picks must answer alike.
            return 1
        pytest.fail('the mpi_ranks fixture is for tests marked '
                    '@pytest.mark.mpi(ranks=[...])', pytrace=False)
    return request.param


# -- where this pytest runs ----------------------------------------------------
def _world_from_environment():
    """``(rank, size)`` when an MPI launcher started this process (from the
    variables MPICH, Open MPI, MVAPICH and PMIx set), else None; MPI itself
    is not started (size from mpi4py only where no variable gives it)."""
    for rank_var, size_var in (('PMI_RANK', 'PMI_SIZE'),
                               ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),
                               ('MV2_COMM_WORLD_RANK', 'MV2_COMM_WORLD_SIZE'),
                               ('PMIX_RANK', None)):
        if rank_var in os.environ:
            if size_var in os.environ:
                return int(os.environ[rank_var]), int(os.environ[size_var])
            from mpi4py import MPI
            return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return None


class InJob:
    """This process is a rank of an MPI job the user started."""

    def __init__(self, rank, size, gather=True):
        self.rank, self.size, self.comm, self.stdout = rank, size, None, None
        # gather: rank 0 alone reports every rank's outcome. Off while a
        # peer plugin is active: under pytest-mpi each rank reports its
        # own, and pytest-isolate-mpi's jobs pickle each rank's reports.
        self.gather = gather
        # pytest captures fd 2 during tests; a timeout's stacks must not
        # vanish with the capture.
        self.stderr = os.fdopen(os.dup(2), 'w')

    def start(self):
        """Called as the session starts, on every rank together."""
        if self.size > 1 and relaunch.have_mpi4py():
            from mpi4py import MPI
            world = MPI.COMM_WORLD
            if self.gather:
                self.comm = world.Dup()
            else:
                world.Barrier()
            # A test's job may be killed at its timeout, or a peer plugin's
            # end when one rank fails: no files left (shm_files).
            shm_files.release_after_init(world, world)

    def exchange(self, item, report):
        """Send this phase's outcome to rank 0; there, fold every rank's
        outcome into ``report`` (the one that will be printed)."""
        spec = mpi_spec(item)
        grace = spec.grace if spec else grace_for(DEFAULT_TIMEOUT)
        mine = reports.record(report)
        if self.rank:
            self._send(report, mine, grace)
            return
        got, missing = self._collect(mine, grace)
        if missing or any(not reports.same_outcome(rec, mine)
                          for rec in got.values()):
            result = reports.combine({r: [rec] for r, rec in got.items()},
                                     self.size, missing,
                                     'mpiexec -n {}'.format(self.size))
            report.outcome, report.longrepr = result.outcome, result.longrepr
            report.sections.extend(result.sections)
        elif mine['outcome'] == 'failed':
            report.sections.append(('minichain mpi', 'the same report on '
                                    'every rank (0-{})'.format(self.size - 1)))
        if missing:  # the missing ranks wait in a collective: end the job
            sys.stderr.write('{}\n{}\n'.format(report.nodeid,
                                               report.longreprtext))
            relaunch.abort_job()
        # Every rank's session counts the same outcome, so that -x and
        # --maxfail stop them all at the same test.
        for rank in got:
            if rank:
                self.comm.send(report.outcome, dest=rank, tag=TAG_TEST_ACK)

    def _send(self, report, mine, grace):
        request = self.comm.isend(mine, dest=0, tag=TAG_TEST_RECORD)
        bad = mine['outcome'] != 'passed'
        # Twice rank 0's wait, so that rank 0 (which reports) goes first.
        if not _wait_for(lambda: self.comm.iprobe(source=0, tag=TAG_TEST_ACK),
                         2 * grace if bad else None):
            sys.stderr.write('[rank {}] {} {} and rank 0 did not collect the '
                             'outcome within {:.0f} s (it is most likely '
                             'waiting for this rank in a collective): ending '
                             'the job.\n{}\n'
                             .format(self.rank, mine['nodeid'],
                                     mine['outcome'], 2 * grace,
                                     mine.get('text', '')))
            relaunch.abort_job()
        report.outcome = self.comm.recv(source=0, tag=TAG_TEST_ACK)
        request.wait()

    def _collect(self, mine, grace):
        """Every rank's record of this phase; once one has failed, the
        others get ``grace`` seconds."""
        from mpi4py import MPI
        got, status = {0: mine}, MPI.Status()
        end = None if mine['outcome'] == 'passed' else \
            time.monotonic() + grace
        while len(got) < self.size:
            if not _wait_for(lambda: self.comm.iprobe(
                    source=MPI.ANY_SOURCE, tag=TAG_TEST_RECORD, status=status),
                    None if end is None else end - time.monotonic()):
                break
            rank = status.Get_source()
            got[rank] = self.comm.recv(source=rank, tag=TAG_TEST_RECORD)
            if got[rank]['outcome'] != 'passed' and end is None:
                end = time.monotonic() + grace
        missing = {r: 'still running {:.0f} s after a rank failed (most '
                      'likely waiting for it in a collective); the job was '
                      'ended'.format(grace)
                   for r in range(self.size) if r not in got}
        return got, missing


def _wait_for(ready, seconds):
    """Poll ``ready()`` until true (True) or ``seconds`` pass (False;
    None: no limit)."""
    end = None if seconds is None else time.monotonic() + max(0.0, seconds)
    while not ready():
        if end is not None and time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


# -- hooks ---------------------------------------------------------------------
def pytest_addoption(parser):
    parser.addini(peers.OWNS_INI, type='bool', default=False,
                  help='every @pytest.mark.mpi of this project is minichain'
                  '\'s, whatever other MPI plugin is installed')


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    peer = peers.active_peer(config)
    if config.getini(peers.OWNS_INI):
        config.pluginmanager.register(peers.Claim(config), peers.OWNS_INI)
    what = ('(ranks=[2, 3], timeout=300): run the test as an MPI job of each '
            'rank count ({}); a bare mark only labels a test that starts MPI '
            'itself'.format(__name__))
    config.addinivalue_line('markers', peers.OWN_MARK + what)
    if peer is None:  # else the peer's marker (see .peers)
        config.addinivalue_line('markers', peers.MARK + what)
    if os.environ.get(relaunch.ENV_JOB):
        state = relaunch.Rank(os.environ.pop(relaunch.ENV_JOB),
                              _world_from_environment() or relaunch.mpi_world())
        config.option.basetemp = state.basetemp
    else:
        world = _world_from_environment()
        state = InJob(*world, gather=peer is None) if world else None
        if state and state.gather and state.rank and state.size > 1 and \
                relaunch.have_mpi4py():
            # The terminal reporter, made next, writes where sys.stdout
            # points now: ranks other than 0 print nothing, and write no
            # JUnit XML over rank 0's.
            state.stdout, sys.stdout = sys.stdout, open(os.devnull, 'w')
            config.option.xmlpath = None
    config.stash[_STATE] = state


def pytest_sessionstart(session):
    state = session.config.stash.get(_STATE, None)
    if isinstance(state, InJob):
        if state.stdout is not None:
            sys.stdout = state.stdout
        state.start()


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc):
    spec = mpi_spec(metafunc.definition)
    if spec is None:
        return
    if 'mpi_ranks' not in metafunc.fixturenames:
        metafunc.fixturenames.append('mpi_ranks')
    metafunc.parametrize('mpi_ranks', spec.ranks, indirect=True,
                         ids=['ranks={}'.format(k) for k in spec.ranks])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    state = config.stash.get(_STATE, None)
    if isinstance(state, relaunch.Rank):
        state.select(config, items)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    state = collector.config.stash.get(_STATE, None)
    report = outcome.get_result()
    if isinstance(state, relaunch.Rank) and report.failed:
        state.add(reports.record(report))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    state = item.config.stash.get(_STATE, None)
    k = ranks_of(item)
    if k is None:
        return None
    option = item.config.option
    if state is None and not (getattr(option, 'setuponly', False) or
                              getattr(option, 'setupplan', False)):
        # Plain pytest: run the test as an MPI job.
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid,
                                      location=item.location)
        job_reports = relaunch.run(item, k, mpi_spec(item))
        # The test ran in the job; here, as pytest's own protocol would,
        # tear down what the next item does not share (a module fixture of
        # an earlier test when this one is the module's last), as
        # pytest-isolate-mpi does. Only pytest's runner's teardown: other
        # plugins' teardown hooks expect their setup, which ran in the job.
        runner = item.config.pluginmanager.get_plugin('runner')
        torn = pytest.CallInfo.from_call(
            lambda: runner.pytest_runtest_teardown(item, nextitem),
            when='teardown')
        if torn.excinfo is not None:
            job_reports[-1] = ihook.pytest_runtest_makereport(item=item,
                                                              call=torn)
        for report in job_reports:
            ihook.pytest_runtest_logreport(report=report)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid,
                                       location=item.location)
        return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    state, k = item.config.stash.get(_STATE, None), ranks_of(item)
    if k is None or state is None:
        return
    if k == state.size:
        if isinstance(state, InJob):
            # In place, a hang ends this rank (and so the job) with stacks.
            faulthandler.dump_traceback_later(mpi_spec(item).timeout,
                                              exit=True, file=state.stderr)
        return
    message = '{} runs as an MPI job of {} ranks; this job has {}'.format(
        item.nodeid, k, state.size)
    if isinstance(state, InJob):
        item.stash[_SKIP] = message
        pytest.skip(message)
    raise RuntimeError(message)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if isinstance(item.config.stash.get(_STATE, None), InJob) and \
            ranks_of(item) is not None:
        faulthandler.cancel_dump_traceback_later()


# tryfirst: the outermost wrapper, so the report is final (xfail applied).
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    state = item.config.stash.get(_STATE, None)
    if item.stash.get(_SKIP, None) and call.when == 'setup':
        # Reported at the test, as pytest does for its skip marks.
        path, line, _ = item.reportinfo()
        outcome.get_result().longrepr = (str(path), line + 1 if line is not
                                         None else None,
                                         'Skipped: ' + item.stash[_SKIP])
    if isinstance(state, InJob) and state.comm is not None:
        state.exchange(item, outcome.get_result())
    elif isinstance(state, relaunch.Rank):
        state.add(reports.record(outcome.get_result()))


def pytest_sessionfinish(session, exitstatus):
    state = session.config.stash.get(_STATE, None)
    if isinstance(state, relaunch.Rank):
        state.finish(int(exitstatus))
