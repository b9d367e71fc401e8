"""The bare protocol trains: every averaging mode of the naive, flat and
ring communicators made with ``layers=()`` equals one process to 1e-10 in
float64, at 2 and 3 ranks (workers/bare.py, under mpiexec; with the layers
installed, the layered communicators too). A lesson test: it imports no
layer and runs in ``make test-peeled``."""
import re

import pytest

from tests.dist._launch import require_mpi, run_mpi


@pytest.mark.mpi
@pytest.mark.parametrize('n', [2, 3])
def test_every_averaging_mode_equals_one_process_without_layers(n):
    require_mpi()
    res = run_mpi(n, 'bare.py', timeout=300)
    assert not res.timed_out and res.returncode == 0, res.output[-6000:]
    found = re.findall(r'BARE-OK rank (\d+) (\d+)', res.output)
    assert sorted(int(r) for r, _ in found) == list(range(n)), res.output
    assert all(int(c) >= 13 for _, c in found), found  # every case ran
