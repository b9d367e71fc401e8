"""minichain's pytest plugin installed beside pytest-isolate-mpi or
pytest-mpi, the MPI plugins a project may already use: a test marked their
way and one marked ours both run, each failure reported by its own plugin.

Each peer (a pinned version, from PyPI) goes into a folder of its own with
``pip install --target`` and joins this venv through ``PYTHONPATH``: pytest
finds its entry point there as it would in site-packages, and mpi4py still
finds this venv's MPICH (it looks beside ``sys.prefix``, which a fresh venv
would move). Skipped, saying why, when pip cannot reach the index.
"""
import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest

from minichain.dist import launcher
from minichain.dist.testing import peers

PINS = {'pytest-isolate-mpi': 'pytest-isolate-mpi==0.4.1',
        'pytest-mpi': 'pytest-mpi==0.6'}
_OFFLINE = ('Could not find a version', 'No matching distribution',
            'Failed to establish', 'Max retries', 'Network is unreachable',
            'Temporary failure in name resolution', 'Name or service not known',
            'ProxyError', 'Connection refused')

ISOLATE_TESTS = '''
import json
import os

import numpy
import pytest

import minichain
from minichain import dist, links as L
from minichain.dist.testing import assert_data_parallel_equivalent


def mpich_files():
    """MPICH's segment that this rank maps and Hydra's topology file that
    its proxy holds, by name, unlinked already or not."""
    with open('/proc/self/maps') as f:
        found = {line.split(None, 5)[5].rstrip() for line in f
                 if '/dev/shm/mpich_shm_' in line}
    fds = '/proc/{}/fd'.format(os.getppid())
    for fd in os.listdir(fds):
        try:
            found.add(os.readlink(os.path.join(fds, fd)))
        except OSError:
            pass
    return sorted(name.replace(' (deleted)', '') for name in found
                  if 'mpich_shm_' in name or 'hydra_hwloc_xmlfile_' in name)


@pytest.mark.mpi(ranks=2, timeout=120, unit="s")
def test_theirs(mpi_ranks):
    from mpi4py import MPI
    assert MPI.COMM_WORLD.size == mpi_ranks == 2


@pytest.mark.mpi(ranks=2, timeout=120, unit="s")
def test_theirs_fails():
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.rank
    with open(os.path.join(os.environ['TMPDIR'], 'files{}.json'.format(
            rank)), 'w') as f:  # MPICH's and Hydra's, maybe unlinked yet
        json.dump(mpich_files(), f)
    assert rank == 0, 'theirs: rank 1 disagrees'


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_equivalence_under_their_launcher(mpi_ranks):
    # Written our way, but @pytest.mark.mpi is theirs here: our
    # equivalence API needs no plugin of ours.
    comm = dist.create_communicator('flat')
    assert comm.size == mpi_ranks == 2
    with minichain.using_config('dtype', 'float64'):
        x = numpy.random.default_rng(0).standard_normal((6, 3))
        t = numpy.arange(6, dtype=numpy.int32) % 2
        assert_data_parallel_equivalent(lambda: L.Linear(3, 2), x, t, comm)


@pytest.mark.minichain_mpi(ranks=[2, 3], timeout=120)
def test_ours(mpi_ranks):
    from mpi4py import MPI
    assert MPI.COMM_WORLD.size == mpi_ranks


@pytest.mark.minichain_mpi(ranks=[2], timeout=120)
def test_ours_fails():
    from mpi4py import MPI
    assert MPI.COMM_WORLD.rank == 0, 'ours: rank 1 disagrees'


def test_unmarked(mpi_ranks):
    assert mpi_ranks == 1  # what pytest-isolate-mpi's fixture gives
'''

PYTEST_MPI_TESTS = '''
import pytest


@pytest.mark.mpi(min_size=2)
def test_theirs():
    from mpi4py import MPI
    assert MPI.COMM_WORLD.size >= 2


@pytest.mark.mpi(min_size=2)
def test_theirs_fails():
    from mpi4py import MPI
    assert MPI.COMM_WORLD.rank == 0, 'theirs: rank 1 disagrees'


@pytest.mark.minichain_mpi(ranks=[2, 3], timeout=120)
def test_ours(mpi_ranks):
    from mpi4py import MPI
    assert MPI.COMM_WORLD.size == mpi_ranks


@pytest.mark.minichain_mpi(ranks=[2], timeout=120)
def test_ours_fails():
    from mpi4py import MPI
    assert MPI.COMM_WORLD.rank == 0, 'ours: rank 1 disagrees'


# ranks= is no keyword of pytest-mpi's: ours, under its --with-mpi rule.
@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_ours_by_the_shared_name(mpi_ranks):
    from mpi4py import MPI
    assert MPI.COMM_WORLD.size == mpi_ranks


def test_unmarked():
    pass
'''


def _install(pin, folder):
    """``pip install --target folder pin``; skips when the index is out of
    reach."""
    done = subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '--no-deps', '--retries',
         '1', '--timeout', '15', '--disable-pip-version-check', '-q',
         '--target', str(folder), pin],
        capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    if done.returncode != 0 and any(word in out for word in _OFFLINE):
        pytest.skip('pip cannot install {} (is the package index out of '
                    'reach?): {}'.format(pin, out.strip().splitlines()[-1]))
    assert done.returncode == 0, out


def _start(folder, files, args, peer_dir, mpiexec_n=None, env=None):
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    # --color=no: Open MPI's mpirun gives its ranks a terminal-like output.
    cmd = [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', '-rA',
           '--color=no',
           '--junitxml', str(folder / 'report.xml')] + args
    if mpiexec_n:
        cmd = launcher.mpiexec_command(mpiexec_n) + cmd
    full_env = dict(os.environ, TMPDIR=str(folder), PYTHONUNBUFFERED='1')
    for name in ('PYTEST_ADDOPTS', 'MINICHAIN_NO_ABORT',
                 'PYTEST_DISABLE_PLUGIN_AUTOLOAD'):
        full_env.pop(name, None)
    full_env['PYTHONPATH'] = os.pathsep.join(
        p for p in (str(peer_dir), os.environ.get('PYTHONPATH')) if p)
    # pytest-isolate-mpi looks for mpirun on PATH: this venv's MPICH.
    full_env['PATH'] = os.pathsep.join(
        [os.path.dirname(sys.executable), os.environ.get('PATH', '')])
    # Where that is Open MPI's mpirun (make test-openmpi's venv has none
    # of its own), what our launcher passes as options, pytest-isolate-mpi
    # cannot: CI runs as root on 2 cores.
    full_env.setdefault('OMPI_ALLOW_RUN_AS_ROOT', '1')
    full_env.setdefault('OMPI_ALLOW_RUN_AS_ROOT_CONFIRM', '1')
    full_env.setdefault('OMPI_MCA_rmaps_base_oversubscribe', '1')
    full_env.update(env or {})
    return (subprocess.Popen(cmd, cwd=folder, env=full_env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
            folder)


class Session:
    def __init__(self, proc, folder):
        self.folder = folder
        out, _ = proc.communicate(timeout=600)
        self.returncode, self.output = proc.returncode, out.decode(
            errors='replace')
        self.cases = {}
        report = folder / 'report.xml'
        if report.exists():
            for case in ET.parse(report).iter('testcase'):
                bad = [c for c in case if c.tag in ('failure', 'error',
                                                    'skipped')]
                self.cases[case.get('name')] = (
                    bad[0].tag if bad else 'passed',
                    (bad[0].text or bad[0].get('message', '')) if bad else '')

    def case(self, name):
        assert name in self.cases, '{} not run:\n{}'.format(name, self.output)
        return self.cases[name]


@pytest.fixture(scope='module')
def sessions(tmp_path_factory):
    pytest.importorskip('mpi4py', reason='mpi4py is not installed')
    if launcher.find_mpiexec() is None:
        pytest.fail(launcher.INSTALL_HINT)
    root = tmp_path_factory.mktemp('peers')
    where = {}
    for peer, pin in PINS.items():
        where[peer] = root / peer
        _install(pin, where[peer])
    iso, pm = where['pytest-isolate-mpi'], where['pytest-mpi']
    # Whichever of the two mpi_ranks fixtures pytest picks (the plugin
    # registered last wins) must answer alike: both orders, by hand.
    by_hand = ['-p', 'pytest_isolate_mpi._plugin', '-p',
               'minichain.dist.testing.pytest_plugin']
    started = {
        'isolate': _start(root / 'isolate', {'test_both.py': ISOLATE_TESTS},
                          [], iso),
        'isolate_order': _start(
            root / 'isolate_order', {'test_both.py': ISOLATE_TESTS},
            ['-k', 'unmarked'] + by_hand, iso,
            env={'PYTEST_DISABLE_PLUGIN_AUTOLOAD': '1'}),
        'isolate_reversed': _start(
            root / 'isolate_reversed', {'test_both.py': ISOLATE_TESTS},
            ['-k', 'unmarked'] + by_hand[2:] + by_hand[:2], iso,
            env={'PYTEST_DISABLE_PLUGIN_AUTOLOAD': '1'}),
        'pytest_mpi': _start(root / 'pytest_mpi',
                             {'test_both.py': PYTEST_MPI_TESTS}, [], pm),
        'pytest_mpi_job': _start(root / 'pytest_mpi_job',
                                 {'test_both.py': PYTEST_MPI_TESTS},
                                 ['--with-mpi'], pm, mpiexec_n=2),
        'pytest_mpi_with': _start(root / 'pytest_mpi_with',
                                  {'test_both.py': PYTEST_MPI_TESTS},
                                  ['--with-mpi'], pm),
    }
    return {name: Session(*s) for name, s in started.items()}


@pytest.mark.mpi
def test_beside_pytest_isolate_mpi_both_kinds_run(sessions):
    s = sessions['isolate']
    assert 'isolate-mpi-0.4.1' in s.output, s.output
    for rank in (0, 1):  # theirs: one report per rank, as it does alone
        assert s.case('test_theirs[2][rank={}]'.format(rank))[0] == \
            'passed', s.output
        assert s.case('test_equivalence_under_their_launcher[2][rank={}]'
                      .format(rank))[0] == 'passed', s.output
    for k in (2, 3):
        assert s.case('test_ours[ranks={}]'.format(k))[0] == 'passed', \
            s.output
    assert s.case('test_unmarked')[0] == 'passed', s.output
    assert 'duplicate parametrization' not in s.output, s.output
    for name in ('isolate_order', 'isolate_reversed'):
        assert sessions[name].case('test_unmarked')[0] == 'passed', \
            sessions[name].output


@pytest.mark.mpi
def test_beside_pytest_isolate_mpi_each_failure_has_its_plugins_report(
        sessions):
    s = sessions['isolate']
    kind, text = s.case('test_theirs_fails[2][rank=1]')
    assert kind == 'failure' and 'theirs: rank 1 disagrees' in text, s.output
    assert s.case('test_theirs_fails[2][rank=0]')[0] == 'passed', s.output
    kind, text = s.case('test_ours_fails[ranks=2]')
    assert kind == 'failure', s.output
    assert text.startswith('mpiexec -n 2: failed on rank 1 (in the test '
                           'body); passed on rank 0.'), text
    assert text.count('AssertionError: ours: rank 1 disagrees') == 1, text
    assert s.returncode == 1, s.output


@pytest.mark.mpi
def test_beside_pytest_isolate_mpi_a_failed_job_leaves_no_mpich_files(
        sessions):
    # Its job of test_theirs_fails ends with rank 1's exit status 1, and
    # Hydra kills rank 0 before MPICH removes its files: our plugin, in
    # each rank too, unlinks them once every rank has opened them.
    s = sessions['isolate']
    names = set()
    for rank in (0, 1):
        names.update(json.loads((s.folder / 'files{}.json'.format(rank))
                                .read_text()))
    if launcher.flavor() == 'mpich':  # the job had both (else no proof)
        assert {n.split('_')[1] for n in map(os.path.basename, names)} == \
            {'shm', 'hwloc'}, names
    assert not [n for n in names if os.path.exists(n)], names


@pytest.mark.mpi
def test_beside_pytest_mpi_both_kinds_run(sessions):
    plain, job = sessions['pytest_mpi'], sessions['pytest_mpi_job']
    # Plain pytest: pytest-mpi skips every mpi test (they need --with-mpi
    # under mpirun), ours by that name too; minichain_mpi ones run as MPI
    # jobs.
    for name in ('test_theirs', 'test_theirs_fails',
                 'test_ours_by_the_shared_name[ranks=2]'):
        kind, text = plain.case(name)
        assert kind == 'skipped' and 'need --with-mpi' in text, plain.output
    for k in (2, 3):
        assert plain.case('test_ours[ranks={}]'.format(k))[0] == 'passed', \
            plain.output
    kind, text = plain.case('test_ours_fails[ranks=2]')
    assert kind == 'failure', plain.output
    assert text.count('AssertionError: ours: rank 1 disagrees') == 1, text
    assert 'failed on rank 1 (in the test body)' in text, text
    # mpiexec -n 2 pytest --with-mpi: each rank reports its own, as under
    # pytest-mpi alone (both ranks write the JUnit file; the last one's is
    # read here), and ours runs in place.
    assert 'rank 1 disagrees' in job.output and job.returncode != 0, \
        job.output
    assert job.output.count('test session starts') == 2, job.output
    assert 'PASSED test_both.py::test_theirs\n' in job.output, job.output
    assert 'PASSED test_both.py::test_ours[ranks=2]' in job.output
    assert 'PASSED test_both.py::test_ours_by_the_shared_name[ranks=2]' in \
        job.output
    assert 'FAILED test_both.py::test_theirs_fails' in job.output
    assert 'FAILED test_both.py::test_ours_fails[ranks=2]' in job.output
    assert 'runs as an MPI job of 3 ranks; this job has 2' in job.output


@pytest.mark.mpi
def test_beside_pytest_mpi_with_mpi_outside_a_job_runs_ours_as_jobs(
        sessions):
    # pytest --with-mpi, no mpirun: pytest-mpi runs its tests on this one
    # process (skipping those of min_size 2); ours still get their jobs,
    # and --with-mpi reaches the ranks (else pytest-mpi skips them there).
    s = sessions['pytest_mpi_with']
    for name in ('test_theirs', 'test_theirs_fails'):
        kind, text = s.case(name)
        assert kind == 'skipped' and 'requires 2 MPI processes' in text, \
            s.output
    for k in (2, 3):
        for name in ('test_ours', 'test_ours_by_the_shared_name'):
            assert s.case('{}[ranks={}]'.format(name, k))[0] == 'passed', \
                s.output


# -- without MPI or PyPI -------------------------------------------------------
class _Manager:
    def __init__(self, pairs):
        self.pairs = pairs

    def list_name_plugin(self):
        return self.pairs


class _Config:
    def __init__(self, *pairs):
        self.pluginmanager = _Manager(list(pairs))


def test_a_peer_is_found_by_its_registered_name_or_module():
    import types
    iso = types.ModuleType('pytest_isolate_mpi._plugin')
    assert peers.active_peer(_Config(('pytest_isolate_mpi', iso))) == \
        'pytest-isolate-mpi'
    assert peers.active_peer(_Config(('x.py', iso))) == 'pytest-isolate-mpi'
    hooks = type('MPIPlugin', (), {'__module__': 'pytest_mpi'})()
    assert peers.active_peer(_Config(('140312', hooks))) == 'pytest-mpi'
    # Blocked (-p no:pytest_mpi), or only a similar name: none.
    mine = types.ModuleType('minichain.dist.testing.pytest_plugin')
    assert peers.active_peer(_Config(('pytest_mpi', None), ('m', mine),
                                     ('pytest_mpi_x', mine))) is None
