"""minichain.dist.launcher: one setting chooses the MPI launcher."""
import os
import signal
import subprocess
import sys
import time

import pytest

from minichain.dist import launcher
from tests.dist._launch import (ORTE_WEDGE, Result, launcher_crashed,
                                launcher_wedged, require_mpi)


def test_environment_variable_wins_and_is_split_like_a_shell(monkeypatch):
    monkeypatch.setenv(launcher.ENV, "/opt/mpi/bin/mpirun --mca 'a b' 1")
    assert launcher.find_mpiexec() == ['/opt/mpi/bin/mpirun', '--mca',
                                       'a b', '1']


def test_default_is_the_mpiexec_beside_this_python(monkeypatch, tmp_path):
    monkeypatch.delenv(launcher.ENV, raising=False)
    (tmp_path / 'mpiexec').write_text('')
    assert launcher.find_mpiexec(str(tmp_path / 'python')) == [
        str(tmp_path / 'mpiexec')]
    here = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    if os.path.exists(here):
        assert launcher.find_mpiexec() == [here]


def test_extra_arguments_go_before_the_rank_count(monkeypatch):
    monkeypatch.setenv(launcher.ENV, sys.executable)  # not an MPI: no flags
    monkeypatch.setenv(launcher.ENV_ARGS, '--foo bar')
    assert launcher.mpiexec_command(3) == [sys.executable, '--foo', 'bar',
                                           '-n', '3']


def test_missing_launcher_says_what_to_install(monkeypatch):
    monkeypatch.delenv(launcher.ENV, raising=False)
    monkeypatch.setattr(launcher, 'find_mpiexec', lambda python=None: None)
    with pytest.raises(launcher.LauncherNotFound,
                       match='pip install mpi4py mpich'):
        launcher.mpiexec_command(2)


def test_flavor_of_the_launcher_in_use():
    require_mpi()
    assert launcher.flavor() in ('mpich', 'openmpi', 'slurm')


def _fake_launcher(folder, name, version):
    """A program called ``name`` that prints ``version`` for --version and
    its arguments otherwise (to see what the launcher would be given)."""
    path = folder / name
    path.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "{}"; '
                    'else printf "%s\\n" "$*"; fi\n'.format(version))
    path.chmod(0o755)
    return str(path)


def test_open_mpi_gets_oversubscribe_quiet_and_the_grace(monkeypatch,
                                                         tmp_path):
    monkeypatch.delenv(launcher.ENV_ARGS, raising=False)
    fake = _fake_launcher(tmp_path, 'mpirun', 'mpirun (Open MPI) 4.1.4')
    monkeypatch.setenv(launcher.ENV, fake)
    assert launcher.flavor() == 'openmpi'
    root = ['--allow-run-as-root'] if os.geteuid() == 0 else []
    assert launcher.mpiexec_command(4, grace=30) == [
        fake, '--oversubscribe'] + root + [
        '-q', '--mca', 'odls_base_sigkill_timeout', '30', '-n', '4']
    assert launcher.mpiexec_command(2, oversubscribe=False, quiet=False) == [
        fake, '-n', '2']


def test_srun_is_known_by_its_name(monkeypatch, tmp_path):
    monkeypatch.delenv(launcher.ENV_ARGS, raising=False)
    fake = _fake_launcher(tmp_path, 'srun', 'srun: fatal: no configuration')
    monkeypatch.setenv(launcher.ENV, fake + ' --mpi=pmi2')
    assert launcher.flavor() == 'slurm'
    assert launcher.mpiexec_command(3, grace=30) == [
        fake, '--mpi=pmi2', '--overcommit', '-n', '3']


def test_a_configured_launcher_that_does_not_exist_is_named(monkeypatch,
                                                            tmp_path):
    monkeypatch.setenv(launcher.ENV, str(tmp_path / 'nope') + ' -x')
    with pytest.raises(launcher.LauncherNotFound, match='nope'):
        launcher.mpiexec_command(2)


def test_module_runs_the_program_under_the_launcher(monkeypatch, tmp_path):
    monkeypatch.delenv(launcher.ENV_ARGS, raising=False)
    fake = _fake_launcher(tmp_path, 'mpiexec', 'HYDRA build details:')
    monkeypatch.setenv(launcher.ENV, fake)
    module = [sys.executable, '-m', 'minichain.dist.launcher']
    out = subprocess.run(module + ['-n', '2', 'prog', '--a', 'b c'],
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, '-n 2 prog --a b c\n')
    out = subprocess.run(module + ['-n', '2', '--print', 'prog', 'b c'],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout == "{} -n 2 prog 'b c'\n".format(fake)
    out = subprocess.run(module + ['-n', '0', 'prog'], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and 'at least 1' in out.stderr


@pytest.mark.mpi
def test_module_starts_real_ranks():
    require_mpi()
    code = ('import os; from mpi4py import MPI; '
            'os.write(1, b"size %d\\n" % MPI.COMM_WORLD.size)')
    out = subprocess.run([sys.executable, '-m', 'minichain.dist.launcher',
                          '-n', '2', sys.executable, '-c', code],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split('\n').count('size 2') == 2, out.stdout


# the tail of the CI log of 2026-12-01 (make test-openmpi, case 'exit')
MPIRUN_CRASH = '''[rank 0] minichain.dist watchdog: ending the job with exit status 70
[vm:15745] *** Process received signal ***
[vm:15745] Signal: Segmentation fault (11)
[vm:15745] [ 1] /lib/x86_64-linux-gnu/libpmix.so.2(PMIx_server_finalize+0xb08)
[vm:15745] [ 5] /lib/x86_64-linux-gnu/libopen-rte.so.40(orte_finalize+0x5d)
[vm:15745] [ 6] /usr/bin/mpirun.openmpi(+0x13ea)[0x5607d1c003ea]
'''


def test_only_the_launchers_own_teardown_crash_is_rerun():
    assert launcher_crashed(-11, MPIRUN_CRASH)
    # a rank's segfault reaches us as mpirun's exit status, not a signal
    assert not launcher_crashed(139, MPIRUN_CRASH)
    assert not launcher_crashed(70, MPIRUN_CRASH)
    # the launcher killed (a hang's SIGKILL), with no backtrace of its own
    assert not launcher_crashed(-9, '[rank 0] waiting\n')


def test_only_the_launchers_own_teardown_hang_is_rerun():
    wedged = '[rank 0] ... ending the job\n[vm:1] [[1,0],0] {} at line 507\n' \
        .format(ORTE_WEDGE)
    assert launcher_wedged(Result(-9, wedged, 100.0, True))
    assert not launcher_wedged(Result(70, wedged, 3.0, False))
    # a hang of the ranks themselves is the test's failure, never rerun
    assert not launcher_wedged(Result(-9, '[rank 0] waiting\n', 100.0, True))
    # without the log line: no process under the launcher ran any more
    assert launcher_wedged(Result(-9, '[rank 0] ending the job\n', 100.0,
                                  True, ranks_gone=True))


@pytest.mark.skipif(not os.path.isdir('/proc'), reason='no /proc')
def test_a_launcher_over_exited_ranks_is_told_from_one_over_running_ranks():
    # sh starts a child, then becomes a sleep that never reaps it: the
    # child is a zombie under a live parent, as the ranks under a wedged
    # mpirun are; or the child still runs, as ranks in a hang do.
    from tests.dist._launch import _running_under
    for child, expected in (('true', 0), ('sleep 30', 1)):
        proc = subprocess.Popen(['sh', '-c', child + ' & exec sleep 30'],
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                running = _running_under(proc.pid)
                if len(running) == expected:
                    break
                time.sleep(0.05)
            assert len(running) == expected, running
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
