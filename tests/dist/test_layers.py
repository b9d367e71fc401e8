"""The bare protocol under its layers: peeled off, it still averages; by
default, the guards are on (workers/layers.py, under mpiexec)."""
import re

import pytest

from minichain import dist
from minichain.dist.communicator_base import with_layers
from minichain.dist.flat import FlatCommunicator
from tests.dist._launch import require_mpi, run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize('n', [2, 3])
def test_the_bare_protocol_averages_and_the_guards_are_on_by_default(n):
    require_mpi()
    res = run_mpi(n, 'layers.py', timeout=120)
    assert not res.timed_out and res.returncode == 0, res.output[-6000:]
    ranks = re.findall(r'LAYERS-OK rank (\d+)', res.output)
    assert sorted(map(int, ranks)) == list(range(n)), res.output[-3000:]


def test_layers_go_in_front_of_the_protocol_class():
    layers = dist.default_layers()
    cls = with_layers(FlatCommunicator, layers)
    assert cls.__mro__[1:len(layers) + 2] == layers + (FlatCommunicator,)
    assert cls.__name__ == 'FlatCommunicator' and cls.layers == layers
    assert with_layers(FlatCommunicator, layers) is cls  # one class
    assert with_layers(FlatCommunicator, ()) is FlatCommunicator
