"""A job that ends any way at all leaves none of MPICH's shared-memory
files (/dev/shm/mpich_shm_*) nor Hydra's topology files
(/tmp/hydra_hwloc_xmlfile_*) behind; MPI_Abort used to leave both."""
import json
import os

import pytest

from minichain.dist import shm_files
from minichain.dist import launcher
from tests.dist._launch import require_mpi, run_mpi


def _named_files(folder):
    names = set()
    for rank in range(2):
        names.update(json.loads((folder / 'files{}.json'.format(rank))
                                .read_text()))
    return names


@pytest.mark.mpi
@pytest.mark.parametrize('how, status', [
    ('normal', 0), ('raise', 1), ('stall', 70), ('kill', None)])
def test_no_mpich_files_are_left_however_the_job_ends(how, status, tmp_path):
    require_mpi()
    if launcher.flavor() != 'mpich':
        pytest.skip('the files are MPICH\'s and Hydra\'s; this launcher is '
                    '{}'.format(launcher.flavor()))
    res = run_mpi(2, 'leftovers.py', how, tmp_path, timeout=60,
                  env={'MINICHAIN_STALL_TIMEOUT': '3'})
    assert not res.timed_out, res.output
    if status is None:
        assert res.returncode != 0, res.output
    else:
        assert res.returncode == status, res.output
    names = _named_files(tmp_path)
    # The job did have both kinds (else the test proves nothing).
    assert any(n.startswith(shm_files.SEGMENT_PREFIX) for n in names), (
        res.output)
    assert any(shm_files.HWLOC_PREFIX in n for n in names), res.output
    left = sorted(n for n in names if os.path.exists(n))
    assert not left, (left, res.output)


def test_lookups_outside_a_hydra_job_find_nothing(tmp_path):
    maps = tmp_path / 'maps'
    maps.write_text(
        '7f00-7f01 rw-s 00000000 00:1a 12 /dev/shm/mpich_shm_ab_0\n'
        '7f01-7f02 rw-s 00000000 00:1a 13 /dev/shm/mpich_shm_cd_0 '
        '(deleted)\n'
        '7f02-7f03 rw-s 00000000 00:1a 14 /dev/shm/other_seg\n'
        '7f03-7f04 rw-p 00000000 00:00 0 \n')
    assert shm_files.mapped_segments(str(maps)) == [
        '/dev/shm/mpich_shm_ab_0']
    assert shm_files.mapped_segments(str(tmp_path / 'none')) == []
    # pytest's parent is no Hydra proxy: its files are not looked at.
    assert shm_files.proxy_files() == []
    assert shm_files.release() == []  # no MPI here: nothing mapped
