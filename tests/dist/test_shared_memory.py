"""The shared-memory layer (minichain/dist/transports/shared_memory.py):
the sum in a file every rank maps, under mpiexec, and its pieces."""
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
