"""The communication timeline under real ``mpiexec -n 2`` and ``-n 3``.

One job per size (workers/timeline_job.py) records two traces: a naive
communicator inside ``timeline.record`` and a flat one started by
``MINICHAIN_TIMELINE``, written by ``finalize()`` (n=3) or at exit (n=2).
"""
import json

import pytest

from minichain.dist.trace import timeline
from tests.dist._launch import require_mpi, run_mpi

N_PARAMS = 4  # the worker's MLP: /l1/W, /l1/b, /l2/W, /l2/b
# Per rank: (updates with a loss function, averaging steps, allreduces in
# each); the first update only broadcasts, a last one has no loss function.
EXPECTED = {'ctx.json': (2, 2, N_PARAMS), 'env.json': (3, 3, 1)}
_jobs = {}


def _job(n, ending, tmp_path_factory):
    if n not in _jobs:
        out = tmp_path_factory.mktemp('timeline{}'.format(n))
        res = run_mpi(n, 'timeline_job.py', out, ending, timeout=90)
        _jobs[n] = (out, res)
    out, res = _jobs[n]
    assert not res.timed_out and res.returncode == 0, res.output[-6000:]
    return out, res.output


@pytest.mark.mpi
@pytest.mark.parametrize('n, ending', [(2, 'atexit'), (3, 'finalize')])
@pytest.mark.parametrize('name', sorted(EXPECTED))
def test_trace_structure_and_every_allreduce_on_every_rank(
        n, ending, name, tmp_path_factory):
    require_mpi()
    out, _ = _job(n, ending, tmp_path_factory)
    trace = json.loads((out / name).read_text())
    assert trace['otherData']['ranks'] == n
    events = trace['traceEvents']
    assert {e['ph'] for e in events} == {'M', 'X'}
    complete = [e for e in events if e['ph'] == 'X']
    for e in complete:
        assert set(e) == {'name', 'cat', 'ph', 'pid', 'tid', 'ts', 'dur',
                          'args'}, e
        assert e['tid'] == timeline.CATEGORIES.index(e['cat'])
        assert e['ts'] >= 0 and e['dur'] >= 0
        # The waits (the header's sync) move no bytes of their own.
        assert ('bytes' in e['args']) == (
            e['cat'] != 'compute' and e['name'] != 'sync'), e
    assert {e['pid'] for e in complete} == set(range(n))
    steps, mean_grads, per_call = EXPECTED[name]
    per_rank = {}
    for r in range(n):
        mine = [e for e in complete if e['pid'] == r]
        counts = {k: sum(e['name'] == k for e in mine) for k in
                  ('forward', 'backward', 'update', 'bcast', 'sync', 'pack',
                   'allreduce', 'unpack')}
        assert counts == {'forward': steps, 'backward': steps,
                          'update': mean_grads, 'bcast': 1,
                          'sync': mean_grads,
                          'pack': mean_grads * per_call,
                          'allreduce': mean_grads * per_call,
                          'unpack': mean_grads * per_call}, (r, counts)
        per_rank[r] = sorted((e for e in mine if e['name'] == 'allreduce'),
                             key=lambda e: e['args']['seq'])
    for k in range(mean_grads * per_call):
        same = [per_rank[r][k] for r in range(n)]
        assert len({e['args']['bytes'] for e in same}) == 1
        assert same[0]['args']['bytes'] > 0
        # One collective: no rank leaves it before every rank entered it
        # (clocks share the zero of a barrier; allow its skew).
        latest_start = max(e['ts'] for e in same)
        assert all(e['ts'] + e['dur'] >= latest_start - 20e3 for e in same)


@pytest.mark.mpi
@pytest.mark.parametrize('n, ending', [(2, 'atexit'), (3, 'finalize')])
def test_rank0_prints_one_summary_per_trace(n, ending, tmp_path_factory):
    require_mpi()
    out, output = _job(n, ending, tmp_path_factory)
    for name in EXPECTED:
        assert output.count('timeline: wrote {}'.format(out / name)) == 1
    assert output.count('busbw GB/s') == 2
    assert output.count('timeline: {} ranks'.format(n)) == 2
    if ending == 'finalize':
        assert 'after finalize, env.json exists: True' in output


@pytest.mark.mpi
@pytest.mark.parametrize('n, ending', [(2, 'atexit'), (3, 'finalize')])
def test_the_wait_for_the_slower_rank_is_recorded_and_summarized(
        n, ending, tmp_path_factory):
    # In ctx.json the last rank sleeps SLOW_S (0.2 s) before each of its 2
    # steps' forward: the others reach the averaging's header that much
    # earlier and wait there, which the trace records as 'sync' and the
    # summary names rank by rank. The others' wait exceeds the sleeper's
    # by about 0.2 s (measured at 2 and 3 ranks: the first update only
    # broadcasts); half of that leaves room for a loaded machine to shift
    # the ranks' arrivals (with 50 ms sleeps, 3 ranks x 3 threads on 2 busy
    # cores once lost half of the wait).
    require_mpi()
    out, output = _job(n, ending, tmp_path_factory)
    trace = json.loads((out / 'ctx.json').read_text())
    sync_ms = [sum(e['dur'] for e in trace['traceEvents']
                   if e['ph'] == 'X' and e['name'] == 'sync' and
                   e['pid'] == r) / 1e3 for r in range(n)]
    assert min(sync_ms[:-1]) - sync_ms[-1] > 100, sync_ms
    summary = timeline.summarize(trace)
    assert 'waiting in the header for the slower rank: ms per rank: 0 ' \
        in summary, summary
    assert 'waiting in the header for the slower rank' in output
