"""minichain's own ``@pytest.mark.mpi`` tests run under minichain's plugin
whatever else is installed (setup.cfg: ``minichain_owns_mpi_mark = true``,
minichain/dist/testing/peers.py): a session of some of them beside a plugin
that claims the ``mpi`` mark and breaks every test so marked, as a peer that
does not work here would, still passes; without the setting it does not.
"""
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CLAIMER = '''
"""Claims @pytest.mark.mpi, as pytest-isolate-mpi does, and breaks every
test so marked: at collection, and again as it runs."""
import pytest


class Claimer:
    @pytest.hookimpl(tryfirst=True)
    def pytest_generate_tests(self, metafunc):
        if metafunc.definition.get_closest_marker('mpi'):
            raise RuntimeError('mpi_claimer took ' + metafunc.definition.name)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        if item.get_closest_marker('mpi'):
            pytest.fail('mpi_claimer took ' + item.nodeid)


def pytest_configure(config):
    config.addinivalue_line('markers', 'mpi: the claimer\\'s')
    config.pluginmanager.register(Claimer(), 'mpi_claimer_hooks')
'''

# Each kind of mark: mpi(ranks=[...]) on a function (run as MPI jobs), a
# module's pytestmark (test_gpu.py), a bare label (tests that start
# mpiexec themselves) and one given by pytest.param (a docs page).
OURS = ['tests/dist/test_auto.py::'
        'test_auto_does_not_pick_nccl_when_ranks_share_a_gpu',
        'tests/dist/test_gpu.py::test_auto_says_once_on_rank_0_why_it_is_'
        'not_nccl[1]',
        'tests/test_docs.py::test_mpiexec_mode_runs_every_rank',
        'tests/test_docs.py::test_page[nccl.md]']


def _session(tmp_path, name, *args):
    folder = tmp_path / name
    folder.mkdir()
    (folder / 'mpi_claimer.py').write_text(textwrap.dedent(CLAIMER))
    env = dict(os.environ, TMPDIR=str(folder), PYTHONPATH=os.pathsep.join(
        p for p in (str(folder), os.environ.get('PYTHONPATH')) if p))
    env.pop('PYTEST_ADDOPTS', None)
    report = folder / 'report.xml'
    done = subprocess.run(
        [sys.executable, '-m', 'pytest', '-p', 'mpi_claimer', '-p',
         'no:cacheprovider', '-q', '--junitxml', str(report)] + list(args),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    cases = {}
    if report.exists():
        for case in ET.parse(report).iter('testcase'):
            bad = [c.tag for c in case if c.tag in ('failure', 'error')]
            cases[case.get('name')] = bad[0] if bad else 'passed'
    return done, cases


@pytest.mark.mpi
def test_our_marked_tests_pass_beside_a_plugin_that_claims_the_mark(
        tmp_path):
    done, cases = _session(tmp_path, 'owned', *OURS)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert sorted(cases) == [
        'test_auto_does_not_pick_nccl_when_ranks_share_a_gpu[ranks=2]',
        'test_auto_does_not_pick_nccl_when_ranks_share_a_gpu[ranks=3]',
        'test_auto_says_once_on_rank_0_why_it_is_not_nccl[1]',
        'test_mpiexec_mode_runs_every_rank', 'test_page[nccl.md]'], out
    assert set(cases.values()) == {'passed'}, out
    assert 'mpi_claimer took' not in out, out


@pytest.mark.mpi
def test_without_the_setting_the_claimer_breaks_them(tmp_path):
    # The control: the claimer does break a test that still has the mark.
    done, cases = _session(tmp_path, 'not_owned', '-o',
                           'minichain_owns_mpi_mark=false', *OURS[1:])
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert 'mpi_claimer took' in out, out
    assert 'passed' not in cases.values(), out


def test_m_mpi_still_selects_the_renamed_marks():
    done = subprocess.run(
        [sys.executable, '-m', 'pytest', '--collect-only', '-q', '-p',
         'no:cacheprovider', '-m', 'not mpi', 'tests/dist/test_auto.py'],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    ids = [line for line in done.stdout.splitlines() if '::' in line]
    assert ids and not any('ranks=' in i for i in ids), done.stdout
