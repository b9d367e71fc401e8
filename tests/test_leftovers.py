"""``make test`` leaves no file in /dev/shm or the temporary folder.

MPI jobs that end badly are the usual culprits: MPICH's shared-memory
segment (/dev/shm/mpich_shm_*) and Hydra's topology file
(/tmp/hydra_hwloc_xmlfile_*) outlive a job whose ranks are killed, Open
MPI's session folders and segments likewise. tests/conftest.py lists both
folders as the session starts and this test, moved to the end of the
session, lists them again: a name that was not there before and is still
there is a leftover. Other programs on the machine write there too, so
the check runs where ``MINICHAIN_CHECK_LEFTOVERS=1`` says the machine is
ours alone (``make test`` and ``make test-openmpi`` set it); the variable
is taken out of the environment, so the test sessions that tests start do
not check again.
"""
import os
import tempfile

import pytest

ENV = 'MINICHAIN_CHECK_LEFTOVERS'
_FIRST = pytest.StashKey()


def folders():
    return sorted({'/dev/shm', '/tmp', tempfile.gettempdir()})


def listing():
    """The paths in the folders, but pytest's own temporary folders (it
    keeps the last three sessions' on purpose)."""
    paths = set()
    for folder in folders():
        try:
            names = os.listdir(folder)
        except OSError:  # no /dev/shm (not Linux)
            continue
        paths.update(os.path.join(folder, name) for name in names
                     if not name.startswith('pytest-of-'))
    return paths


def take_first_listing(config):
    if os.environ.pop(ENV, '') == '1':
        config.stash[_FIRST] = listing()


def _describe(path):
    try:
        st = os.lstat(path)
    except OSError:
        return path
    return '{} ({} bytes)'.format(path, st.st_size)


def this_process_holds():
    """What this (the pytest) process itself holds, and removes when it
    exits: the MPICH segment it maps (a test that started MPI in-process:
    MPI_Finalize at exit unlinks it) and multiprocessing's folder (its
    atexit hook removes it). Not leftovers, yet."""
    from multiprocessing import process
    from minichain.dist import shm_files
    held = set(shm_files.mapped_segments())
    held.add(process.current_process()._config.get('tempdir'))
    return held


def test_the_session_left_nothing_in_dev_shm_or_tmp(request):
    first = request.config.stash.get(_FIRST, None)
    if first is None:
        pytest.skip('{}=1 is not set (make test sets it: the machine must '
                    'be ours alone for the check)'.format(ENV))
    left = sorted(listing() - first - this_process_holds())
    assert not left, (
        'the test session left {} file(s) in {} (none was there when it '
        'started):\n  {}'.format(len(left), ' and '.join(folders()),
                                 '\n  '.join(map(_describe, left))))


def test_the_listing_sees_a_new_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    first = listing()
    (tmp_path / 'hydra_hwloc_xmlfile_x').write_text('')
    (tmp_path / 'pytest-of-me').mkdir()
    assert listing() - first == {str(tmp_path / 'hydra_hwloc_xmlfile_x')}
