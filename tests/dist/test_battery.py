"""Every CPU communicator under real ``mpiexec -n K`` for K = 1, 2, 3, 4.

One MPI job per K runs all the checks of workers/battery.py (launching is
the slow part); each check is reported as its own test.
"""
import json

import pytest

from tests.dist._launch import require_mpi, run_mpi
from tests.dist.workers.battery import CHECKS

SIZES = (1, 2, 3, 4)
_cache = {}


def _battery(n, tmp_path_factory):
    if n not in _cache:
        out = tmp_path_factory.mktemp('battery{}'.format(n))
        res = run_mpi(n, 'battery.py', out, timeout=150,
                      env={'BATTERY_DUMP_AFTER': '140'})
        files = [out / 'rank{}.json'.format(r) for r in range(n)]
        if res.timed_out or res.returncode != 0 or not all(
                f.exists() for f in files):
            _cache[n] = ('mpiexec -n {} battery.py: rc={} timed_out={}\n{}'
                         .format(n, res.returncode, res.timed_out,
                                 res.output[-6000:]))
        else:
            _cache[n] = [json.loads(f.read_text()) for f in files]
    return _cache[n]


@pytest.mark.mpi
@pytest.mark.parametrize('n', SIZES)
@pytest.mark.parametrize('check', CHECKS)
def test_check(n, check, tmp_path_factory):
    require_mpi()
    results = _battery(n, tmp_path_factory)
    if isinstance(results, str):
        pytest.fail(results)
    for rank, per_rank in enumerate(results):
        assert check in per_rank, 'rank {} did not run {}'.format(rank, check)
        assert per_rank[check] is None, per_rank[check]


def test_every_check_exists():
    from tests.dist.workers import checks_generic, checks_model
    for name in CHECKS:
        module = checks_model if ':' in name else checks_generic
        assert callable(getattr(module, name.split(':')[-1]))
