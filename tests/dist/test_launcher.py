"""minichain.dist.launcher: one setting chooses the MPI launcher."""
import os
import sys

import pytest

from minichain.dist import launcher


def test_environment_variable_wins_and_is_split_like_a_shell(monkeypatch):
    monkeypatch.setenv(launcher.ENV, "/opt/mpi/bin/mpirun --mca 'a b' 1")
    assert launcher.find_mpiexec() == ['/opt/mpi/bin/mpirun', '--mca',
                                       'a b', '1']


def test_default_is_the_mpiexec_beside_this_python(monkeypatch):
    monkeypatch.delenv(launcher.ENV, raising=False)
    here = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    if not os.path.exists(here):
        pytest.skip('no mpiexec beside {}'.format(sys.executable))
    assert launcher.find_mpiexec() == [here]


def test_extra_arguments_go_before_the_rank_count(monkeypatch):
    monkeypatch.setenv(launcher.ENV, sys.executable)  # not an MPI: no flags
    monkeypatch.setenv(launcher.ENV_ARGS, '--foo bar')
    assert launcher.mpiexec_command(3) == [sys.executable, '--foo', 'bar',
                                           '-n', '3']


def test_missing_launcher_says_what_to_install(monkeypatch):
    monkeypatch.delenv(launcher.ENV, raising=False)
    monkeypatch.setattr(launcher, 'find_mpiexec', lambda: None)
    with pytest.raises(launcher.LauncherNotFound, match='minichain\\[mpi\\]'):
        launcher.mpiexec_command(2)


def test_flavor_of_the_project_mpich():
    if launcher.find_mpiexec() is None:
        pytest.skip(launcher.INSTALL_HINT)
    assert launcher.flavor() in ('mpich', 'openmpi', 'unknown')
