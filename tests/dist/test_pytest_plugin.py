"""minichain.dist.testing.pytest_plugin, used as a user would: files of tests
in a temporary folder, run by plain ``pytest`` (and by ``mpiexec -n 2 pytest``)
in subprocesses, with the plugin found through its entry point.

The sessions start together (most of their time is waiting for MPI jobs or
for a timeout) and each test reads the outcome of its own.
"""
import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET

import pytest

from minichain.dist.testing import reports as reports
from minichain.dist import launcher
from minichain.dist.testing import relaunch as relaunch
from minichain.dist.testing.pytest_plugin import MpiSpec

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'docs', 'testing.md')

README = os.path.join(os.path.dirname(PAGE), os.pardir, 'README.md')

# More of a user's tests, beside the ones of docs/testing.md.
MORE = '''
import numpy
import pytest

from minichain import dist
from minichain.dist.testing import assert_data_parallel_equivalent
from test_parallel import Net, batch


def test_unmarked_on_one_process():
    comm = dist.create_communicator('flat')
    x, t = batch()
    assert_data_parallel_equivalent(Net, x, t, comm)


@pytest.mark.mpi(ranks=[2], timeout=30)
def test_one_rank_fails():
    comm = dist.create_communicator('flat')
    if comm.rank == 1:
        assert comm.rank == 0, 'rank 1 disagrees'
    comm.allreduce(numpy.ones(2))  # rank 0 waits here for rank 1


@pytest.mark.mpi(ranks=[2])
def test_skipped_everywhere():
    pytest.skip('not on this machine')
'''


def _readme_block():
    """README's test_parallel.py, as a user would copy it into a file."""
    with open(README) as f:
        text = f.read()
    start = text.index('```python\n# test_parallel.py') + len('```python\n')
    return text[start:text.index('```', start)]


def _page_blocks():
    """The page's test file (its runnable blocks) and its failure output."""
    from tests.test_docs import read_page
    page = read_page(PAGE)
    code = '\n\n'.join(b.code for b in page.blocks if b.run)
    with open(PAGE) as f:
        text = f.read()
    shown = text.split('______ test_per_rank_batch_norm[ranks=2] ______')[1]
    return code, shown.split('```')[0]


HANG = '''
import time
import pytest


@pytest.mark.mpi(ranks=[2], timeout=15)
def test_sleeps():
    time.sleep(600)
'''

IN_JOB = '''
import pytest
from mpi4py import MPI


@pytest.mark.mpi(ranks=[2, 3])
def test_size(mpi_ranks):
    assert MPI.COMM_WORLD.size == mpi_ranks


def test_rank_1_only_fails():
    assert MPI.COMM_WORLD.rank == 0, 'only rank 0 agrees'
'''

MARKS = '''
import pytest


@pytest.mark.mpi(ranks=[2, 3])
@pytest.mark.parametrize('a', ['x', 'y'])
def test_ids(a):
    pass


@pytest.mark.mpi
def test_bare_label():
    pass
'''

BAD_MARK = '''
import pytest


@pytest.mark.mpi(ranks=[0])
def test_bad():
    pass
'''

# Marks of the peer plugins (tests/dist/test_plugin_peers.py runs them
# with the peer installed); here neither is.
ISOLATE_MARK = '''
import pytest


@pytest.mark.mpi(ranks=2, timeout=60, unit="s")
def test_isolate_style():
    pass
'''

PYTEST_MPI_MARK = '''
import pytest


@pytest.mark.mpi(min_size=2)
def test_pytest_mpi_style():
    pass
'''

OWN_MARK = '''
import pytest


@pytest.mark.minichain_mpi(ranks=[2, 3])
def test_own_name(mpi_ranks):
    pass
'''

# An mpi test last in its module, after a test that set up a module
# fixture: the fixture must be torn down before the next module's test.
LAST_IN_MODULE = '''
import pytest


@pytest.fixture(scope='module')
def resource():
    yield
    print('torn down')


def test_first(resource):
    pass


@pytest.mark.mpi(ranks=[2])
def test_last():
    pass
'''

NEXT_MODULE = '''
def test_next():
    pass
'''

NO_MPIEXEC = '''
import minichain.dist.launcher
# As if none were installed:
minichain.dist.launcher.find_mpiexec = lambda python=None: None
'''

ONE_TEST = '''
import pytest


@pytest.mark.mpi(ranks=[2])
def test_needs_mpiexec():
    pass
'''


def _start(folder, files, args, env=None, mpiexec_n=None):
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    cmd = [sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider',
           '--junitxml', str(folder / 'report.xml')] + args
    if mpiexec_n:
        cmd = launcher.mpiexec_command(mpiexec_n) + cmd
    full_env = dict(os.environ, TMPDIR=str(folder), PYTHONUNBUFFERED='1')
    for name in ('PYTEST_ADDOPTS', 'MINICHAIN_NO_ABORT'):
        full_env.pop(name, None)
    full_env.update(env or {})
    return (subprocess.Popen(cmd, cwd=folder, env=full_env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
            folder, time.monotonic())


@pytest.fixture(scope='module')
def sessions(tmp_path_factory):
    pytest.importorskip('mpi4py', reason='mpi4py is not installed')
    if launcher.find_mpiexec() is None:
        pytest.fail(launcher.INSTALL_HINT)
    root = tmp_path_factory.mktemp('plugin')
    started = {
        'model': _start(root / 'model', {'test_parallel.py': _page_blocks()[0],
                                         'test_more.py': MORE}, ['-rA']),
        'readme': _start(root / 'readme',
                         {'test_parallel.py': _readme_block()}, ['-rA']),
        'hang': _start(root / 'hang', {'test_hang.py': HANG}, []),
        'in_job': _start(root / 'in_job', {'test_in_job.py': IN_JOB},
                         ['-rA'], mpiexec_n=2),
        'marks': _start(root / 'marks', {'test_marks.py': MARKS,
                                         'test_bad_mark.py': BAD_MARK,
                                         'test_isolate_mark.py': ISOLATE_MARK,
                                         'test_mpi_mark.py': PYTEST_MPI_MARK,
                                         'test_own_mark.py': OWN_MARK},
                        ['--collect-only', '-q']),
        'last_in_module': _start(root / 'last_in_module', {
            'test_a.py': LAST_IN_MODULE, 'test_b.py': NEXT_MODULE},
            ['-rA', '-s']),
        'no_mpiexec': _start(root / 'no_mpiexec', {
            'conftest.py': NO_MPIEXEC, 'test_one.py': ONE_TEST}, []),
        'bad_mpiexec': _start(root / 'bad_mpiexec', {'test_one.py': ONE_TEST},
                              [], env={launcher.ENV: '/nonexistent/mpiexec'}),
    }
    done = {}
    for name, (proc, folder, start) in started.items():
        out, _ = proc.communicate(timeout=600)
        done[name] = Session(proc.returncode, out.decode(errors='replace'),
                             folder, time.monotonic() - start)
    return done


class Session:
    def __init__(self, returncode, output, folder, elapsed):
        self.returncode, self.output, self.elapsed = returncode, output, \
            elapsed
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


@pytest.mark.mpi
def test_readme_example_passes_as_a_user_would_copy_it(sessions):
    readme = sessions['readme']
    for k in (2, 3, 4):
        assert readme.case('test_my_model_trains_like_one_process[ranks={}]'
                           .format(k))[0] == 'passed', readme.output


@pytest.mark.mpi
def test_page_synchronized_bn_passes_at_2_3_4_ranks_with_unequal_batches(
        sessions):
    model = sessions['model']
    for k in (2, 3, 4):
        assert model.case('test_trains_like_one_process[ranks={}]'.format(
            k))[0] == 'passed', model.output


@pytest.mark.mpi
def test_page_local_bn_fails_at_2_ranks_naming_a_parameter_and_the_rank(
        sessions):
    kind, text = sessions['model'].case('test_per_rank_batch_norm[ranks=2]')
    assert kind == 'failure', text
    assert 'mpiexec -n 2: failed on ranks 0-1 (in the test body).' in text
    # Reported once, not once per rank.
    assert text.count('training on 2 ranks differs from one process') == 1
    assert 'gradient of /bn/beta on rank 0' in text, text
    assert 'rtol 1e-10' in text, text
    for line in _page_blocks()[1].splitlines():  # the page shows this run
        if line.startswith(('mpiexec -n', '==== ', '>', 'E       Assertion')):
            assert line.split(' (44 mismatches)')[0] in text, line


@pytest.mark.mpi
def test_unmarked_call_on_one_process_does_not_pass(sessions):
    kind, text = sessions['model'].case('test_unmarked_on_one_process')
    assert kind == 'failure', text
    assert 'NotEnoughRanksError' in text and 'has 1 rank' in text, text
    assert '@pytest.mark.mpi(ranks=[2, 3])' in text, text


@pytest.mark.mpi
def test_failure_names_the_failing_rank_and_where_the_other_waits(sessions):
    kind, text = sessions['model'].case('test_one_rank_fails[ranks=2]')
    assert kind == 'failure', text
    assert 'failed on rank 1 (in the test body)' in text, text
    assert text.count('AssertionError: rank 1 disagrees') == 1, text
    assert 'rank 0 did not finish' in text, text
    assert 'waiting for that rank in a collective' in text, text
    rank0 = text.split('rank 0 did not finish')[1]
    assert 'in allreduce' in rank0 and 'in test_one_rank_fails' in rank0, \
        text


@pytest.mark.mpi
def test_skip_on_every_rank_is_a_skip_with_its_reason(sessions):
    kind, text = sessions['model'].case('test_skipped_everywhere[ranks=2]')
    assert kind == 'skipped' and 'not on this machine' in text, text


@pytest.mark.mpi
def test_summary_and_exit_code(sessions):
    model = sessions['model']
    assert model.returncode == 1, model.output
    assert '3 failed, 3 passed, 1 skipped' in model.output, model.output


@pytest.mark.mpi
def test_a_hung_test_is_ended_at_its_timeout_saying_where(sessions):
    hang = sessions['hang']
    kind, text = hang.case('test_sleeps[ranks=2]')
    assert kind == 'failure', text
    assert 'did not finish on ranks 0-1' in text, text
    assert 'the timeout of 15 s (mpi(timeout=...)) ended the job' in text
    assert 'in test_sleeps' in text, text  # the stacks, grouped
    assert text.count('did not finish ====') == 1, text
    assert hang.elapsed < 120, hang.elapsed


@pytest.mark.mpi
def test_inside_an_mpi_job_rank_0_alone_reports_every_rank(sessions):
    job = sessions['in_job']
    assert job.output.count('test session starts') == 1, job.output
    assert job.returncode != 0, job.output
    assert job.case('test_size[ranks=2]')[0] == 'passed', job.output
    kind, text = job.case('test_size[ranks=3]')
    assert kind == 'skipped', job.output
    assert 'runs as an MPI job of 3 ranks; this job has 2' in text
    kind, text = job.case('test_rank_1_only_fails')
    assert kind == 'failure', job.output
    assert 'failed on rank 1 (in the test body); passed on rank 0' in text
    assert text.count('AssertionError: only rank 0 agrees') == 1, text


@pytest.mark.mpi
def test_ids_and_mark_checks(sessions):
    out = sessions['marks'].output
    for k in (2, 3):
        for a in 'xy':
            assert 'test_marks.py::test_ids[{}-ranks={}]'.format(a, k) in out
    assert 'test_marks.py::test_bare_label\n' in out, out
    assert 'ranks must be a non-empty list of rank counts >= 1' in out, out
    assert 'test_bad_mark.py::test_bad' in out, out
    for k in (2, 3):
        assert 'test_own_mark.py::test_own_name[ranks={}]'.format(k) in out
    # A peer's mark, the peer not installed: one line saying whose it is.
    assert ('@pytest.mark.mpi(unit=...) is a mark of pytest-isolate-mpi, '
            'which is not active in this session') in out, out
    assert ('@pytest.mark.mpi(min_size=...) is a mark of pytest-mpi, '
            'which is not active') in out, out


@pytest.mark.mpi
def test_module_fixture_torn_down_when_an_mpi_test_is_last(sessions):
    run = sessions['last_in_module']
    assert run.returncode == 0, run.output
    for name in ('test_first', 'test_last[ranks=2]', 'test_next'):
        assert run.case(name)[0] == 'passed', run.output
    # Before the next module's test, not at the end of the session.
    assert run.output.index('torn down') < run.output.index(
        'test_b.py .'), run.output


@pytest.mark.mpi
def test_missing_mpiexec_fails_saying_what_to_install(sessions):
    for name, words in (('no_mpiexec', 'no mpiexec found'),
                        ('bad_mpiexec', 'no such program '
                                        '(/nonexistent/mpiexec)')):
        kind, text = sessions[name].case('test_needs_mpiexec[ranks=2]')
        assert kind == 'failure', sessions[name].output
        assert words in text and 'pip install -e ".[mpi]"' in text, text


NEW = 'minichain.dist.testing.pytest_plugin'


@pytest.fixture(scope='module')
def by_name(tmp_path_factory):
    """The plugin turned on and off by name."""
    pytest.importorskip('mpi4py', reason='mpi4py is not installed')
    root = tmp_path_factory.mktemp('names')
    manual = {'PYTEST_DISABLE_PLUGIN_AUTOLOAD': '1'}
    started = {
        'new_manual': _start(root / 'new_manual', {'test_one.py': ONE_TEST},
                             ['-p', NEW], env=manual),
        'off': _start(root / 'off', {'test_one.py': ONE_TEST},
                      ['-p', 'no:' + NEW, '--collect-only', '-q']),
    }
    done = {}
    for name, (proc, folder, start) in started.items():
        out, _ = proc.communicate(timeout=600)
        done[name] = Session(proc.returncode, out.decode(errors='replace'),
                             folder, time.monotonic() - start)
    return done


@pytest.mark.mpi
def test_plugin_on_by_its_name(by_name):
    for name in ('new_manual',):
        run = by_name[name]
        assert run.returncode == 0, run.output
        assert run.case('test_needs_mpiexec[ranks=2]')[0] == 'passed', \
            run.output
        assert 'already registered' not in run.output, run.output


@pytest.mark.mpi
def test_plugin_off_by_its_name(by_name):
    off = by_name['off'].output
    assert 'test_one.py::test_needs_mpiexec\n' in off, off  # no [ranks=2]


# -- without MPI -------------------------------------------------------------
def test_plugin_import_is_light():
    res = subprocess.run(
        [sys.executable, '-c', 'import sys, minichain.dist.testing.'
         'pytest_plugin; print("mpi4py" in sys.modules)'],
        capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == 'False', res.stderr


def _rec(outcome, when='call', text='', **extra):
    rec = {'nodeid': 't', 'outcome': outcome, 'when': when, 'duration': 0}
    if outcome == 'failed':
        rec.update(text=text, sections=[['Captured stdout call', 'hi']])
    if outcome == 'skipped':
        rec['skip'] = ['t.py', 3, 'Skipped: why']
    rec.update(extra)
    return rec


def _passed():
    return [_rec('passed', 'setup'), _rec('passed'),
            _rec('passed', 'teardown')]


def test_combine_passes_only_when_every_rank_passed():
    assert reports.combine({0: _passed(), 1: _passed()}, 2).outcome == \
        'passed'
    result = reports.combine({0: _passed()}, 2)
    assert result.outcome == 'failed'
    assert 'did not finish on rank 1' in result.longrepr
    assert 'it reported nothing' in result.longrepr


def test_combine_groups_equal_failures_and_lists_the_rest():
    bad = [_rec('passed', 'setup'), _rec('failed', text='E boom'),
           _rec('passed', 'teardown')]
    other = [_rec('passed', 'setup'), _rec('failed', text='E other'),
             _rec('passed', 'teardown')]
    result = reports.combine({0: bad, 1: _passed(), 2: bad, 3: other}, 4,
                             launched='mpiexec -n 4')
    assert result.outcome == 'failed' and result.when == 'call'
    first = result.longrepr.splitlines()[0]
    assert first == ('mpiexec -n 4: failed on ranks 0, 2 (in the test body); '
                     'failed on rank 3 (in the test body); passed on rank 1.')
    assert result.longrepr.count('E boom') == 1
    assert "==== ranks 0, 2, in the test body (the same error on each; rank " \
        "0's report) ====" in result.longrepr
    assert ('Captured stdout call (ranks 0, 2)', 'hi') in result.sections


def test_combine_skip_and_mixed_skip():
    skipped = [_rec('skipped', 'setup'), _rec('passed', 'teardown')]
    result = reports.combine({0: skipped, 1: skipped}, 2)
    assert result[:3] == ('skipped', 'setup', ('t.py', 3, 'Skipped: why'))
    result = reports.combine({0: skipped, 1: _passed()}, 2)
    assert result.outcome == 'failed'
    assert 'skipped on rank 0; passed on rank 1' in result.longrepr
    assert 'rank 0: Skipped: why' in result.longrepr


def test_stacks_stop_at_pytest_and_drop_thread_ids(tmp_path):
    dump = tmp_path / 'rank0.stack'
    dump.write_text('Current thread 0x00007f09c4bc0b80 (most recent call '
                    'first):\n  File "/u/test_a.py", line 3 in test_a\n'
                    '  File "/v/_pytest/python.py", line 187 in call\n'
                    '  File "/v/pluggy/_hooks.py", line 1 in x\n')
    assert relaunch._stacks(str(dump)) == (
        'Current thread (most recent call first):\n'
        '  File "/u/test_a.py", line 3 in test_a\n  ... (pytest)')
    assert relaunch._stacks(str(tmp_path / 'missing')) == ''


def test_job_environment_sets_the_stall_watchdog_below_the_timeout(
        monkeypatch):
    for name in (relaunch.ENV_STALL, 'OMP_NUM_THREADS'):
        monkeypatch.delenv(name, raising=False)
    env = relaunch._environment(MpiSpec([2], 300.0), 2, '/job')
    assert env[relaunch.ENV_STALL] == '270' and env[relaunch.ENV_JOB] == '/job'
    assert env['OMP_NUM_THREADS'] == str(max(1, len(
        os.sched_getaffinity(0)) // 2))
    assert float(relaunch._environment(MpiSpec([2], 10.0), 2, '/job')[
        relaunch.ENV_STALL]) == 8
    monkeypatch.setenv(relaunch.ENV_STALL, '0')  # the user's choice stays
    monkeypatch.setenv('OMP_NUM_THREADS', '3')
    env = relaunch._environment(MpiSpec([2], 300.0), 2, '/job')
    assert env[relaunch.ENV_STALL] == '0' and env['OMP_NUM_THREADS'] == '3'
