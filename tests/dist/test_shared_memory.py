"""The shared-memory layer (minichain/dist/transports/shared_memory.py):
the sum in a file every rank maps, under mpiexec, and its pieces."""
import os
import re

import numpy
import pytest

from minichain import dist
from minichain.dist.transports import shared_memory
from tests.dist._launch import require_mpi, run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize('n', [2, 3])
def test_the_flat_sum_goes_through_shared_memory_on_one_machine(n):
    require_mpi()
    res = run_mpi(n, 'shared_memory.py', timeout=180)
    assert not res.timed_out and res.returncode == 0, res.output[-6000:]
    ranks = re.findall(r'SHM-OK rank (\d+)', res.output)
    assert sorted(map(int, ranks)) == list(range(n)), res.output[-3000:]


def test_it_is_a_default_layer_behind_the_guards():
    layers = dist.default_layers()
    assert shared_memory.SharedMemory in layers
    names = [cls.__name__ for cls in layers]
    assert names.index('Guarded') < names.index('SharedMemory') \
        < names.index('Pipelined'), names


def test_a_piece_is_half_a_level_2_cache_within_bounds():
    piece = shared_memory.piece_bytes()
    assert 64 << 10 <= piece <= 4 << 20


def test_regions_tell_views_into_their_own_part():
    import mmap
    n = 1000
    stride = shared_memory._region_bytes(numpy.dtype('float32'), n)
    mm = mmap.mmap(-1, 2 * stride)
    regions = shared_memory.Regions(mm, 'float32', n, 2, 1)
    own = regions.own
    assert regions.offset_of(own) == 0
    assert regions.offset_of(own[10:20]) == 10
    assert regions.offset_of(regions.all[0][10:20]) is None  # rank 0's
    assert regions.offset_of(own.view(numpy.int32)) is None
    assert regions.offset_of(numpy.zeros(4, numpy.float32)) is None
    assert own.__array_interface__['data'][0] % mmap.PAGESIZE == 0


# (ranks, point, victim): the points of workers/shm_kill.py
ENDINGS = [(2, 'map', 1), (2, 'made', 0), (2, 'gather1', 0),
           (2, 'gather1', 1), (2, 'gather2', 0), (2, 'gather2', 1),
           (2, 'sum', 0), (2, 'sum', 1), (2, 'done', 1),
           (3, 'gather1', 2), (3, 'gather2', 2), (3, 'sum', 1)]


@pytest.fixture
def shm_folder():
    """A private folder where the file is made (in /dev/shm when it can
    be), so that no other job's files are seen; removed after."""
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix='minichain-test-',
                              dir=shared_memory._shm_dir())
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.mpi
@pytest.mark.parametrize('how', ['kill', 'raise'])
@pytest.mark.parametrize('n, point, victim', ENDINGS)
def test_no_file_is_left_when_a_rank_ends_in_the_first_averaging(
        n, point, victim, how, shm_folder):
    # A rank killed (or aborting) while rank 0's file still had its name
    # left it in /dev/shm: 204 MB at ResNet-50's size on 2 ranks.
    require_mpi()
    res = run_mpi(n, 'shm_kill.py', point, victim, how, shm_folder,
                  timeout=90)
    assert not res.timed_out and res.returncode != 0, res.output[-3000:]
    if point == 'done':  # the averaging went through the file
        assert 'SHM-USED rank {}'.format(victim) in res.output, res.output
    assert os.listdir(shm_folder) == [], res.output[-3000:]


@pytest.mark.mpi
@pytest.mark.parametrize('n', [2, 3])
def test_the_ending_control_goes_through_the_file(n, shm_folder):
    require_mpi()
    res = run_mpi(n, 'shm_kill.py', 'none', 0, 'kill', shm_folder,
                  timeout=90)
    assert not res.timed_out and res.returncode == 0, res.output[-3000:]
    ranks = re.findall(r'SHM-USED rank (\d+)', res.output)
    assert sorted(map(int, ranks)) == list(range(n)), res.output[-3000:]
    assert os.listdir(shm_folder) == [], res.output
