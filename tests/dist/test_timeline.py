"""minichain.dist.trace.timeline in one process (no MPI): trace format, summary,
recording and the optimizer's instrumentation. The multi-rank merge is
tested under mpiexec in test_timeline_mpi.py."""
import json
import types

import numpy
import pytest

from minichain import functions as F
from minichain import optimizers
from minichain.dist import hooks
from minichain.dist.trace import timeline
from minichain.dist.optimizers import create_multi_node_optimizer
from tests.dist.workers._models import MLP

ONE = types.SimpleNamespace(rank=0, size=1)  # a one-rank stand-in for comm


@pytest.fixture(autouse=True)
def no_recorder_left():
    yield
    leftover, timeline.active = timeline.active, None
    assert leftover is None, 'a test left a timeline recording'


def _trace(durations_us, nbytes):
    """A trace of one allreduce per rank with the given durations."""
    return timeline.to_trace([[('allreduce', 0.0, d * 1e-6, nbytes)]
                              for d in durations_us])


def test_to_trace_format():
    trace = timeline.to_trace([
        [('forward', 0.001, 0.003, None), ('pack', 0.003, 0.0031, 40),
         ('allreduce', 0.0031, 0.004, 40), ('allreduce', 0.004, 0.005, 8)],
        [('forward', 0.0, 0.002, None)]])
    assert trace['otherData']['ranks'] == 2
    assert trace['displayTimeUnit'] == 'ms'
    meta = [e for e in trace['traceEvents'] if e['ph'] == 'M']
    assert {(e['pid'], e['tid'], e['args']['name']) for e in meta} == {
        (r, t, name) for r in (0, 1)
        for t, name in enumerate(('compute', 'copy', 'comm'))} | {
        (0, 0, 'rank 0'), (1, 0, 'rank 1')}
    x = [e for e in trace['traceEvents'] if e['ph'] == 'X']
    assert [(e['pid'], e['name'], e['cat'], e['tid']) for e in x] == [
        (0, 'forward', 'compute', 0), (0, 'pack', 'copy', 1),
        (0, 'allreduce', 'comm', 2), (0, 'allreduce', 'comm', 2),
        (1, 'forward', 'compute', 0)]
    assert x[0]['ts'] == pytest.approx(1000.0)
    assert x[0]['dur'] == pytest.approx(2000.0)
    assert x[0]['args'] == {'seq': 0}
    assert x[3]['args'] == {'seq': 1, 'bytes': 8}
    json.dumps(trace)  # serializable as is


@pytest.mark.parametrize('p, factor', [(2, 1.0), (4, 1.5)])
def test_summary_bus_bandwidth(p, factor):
    # 1 MB in at most 200 us: algbw 5 GB/s; busbw = algbw * 2(p-1)/p.
    durations = [100.0] * (p - 1) + [200.0]
    text = timeline.summarize(_trace(durations, 10 ** 6))
    row = next(line for line in text.splitlines()
               if line.split()[0] == '0').split()
    assert row[1] == '1,000,000'
    assert float(row[2]) == pytest.approx(0.2)
    assert float(row[3]) == pytest.approx(5.0)
    assert float(row[4]) == pytest.approx(5.0 * factor)
    assert 'all 1' in text


def test_summary_lists_few_rows_and_totals():
    per_rank = [[('allreduce', i * 1e-3, i * 1e-3 + 1e-4, 100)
                 for i in range(20)]] * 2
    text = timeline.summarize(timeline.to_trace(per_rank))
    assert text.count('\n') < 16
    total = text.splitlines()[-1].split()
    assert total[:3] == ['all', '20', '2,000']
    assert float(total[3]) == pytest.approx(2.0)  # ms


def test_summary_flags_ranks_that_disagree():
    trace = timeline.to_trace([[('allreduce', 0, 1e-4, 8)] * 2,
                               [('allreduce', 0, 1e-4, 8)]])
    assert 'allreduces per rank differ: [2, 1]' in timeline.summarize(trace)
    trace = timeline.to_trace([[('forward', 0, 1e-3, None)]])
    assert 'no allreduce recorded' in timeline.summarize(trace)


def test_summary_names_the_waits_and_the_overlapped_buckets():
    # Overlapped: no allreduce after backward, buckets in flight during it
    # and the exposed wait after it; rank 1 was slower, so rank 0 waited.
    rank0 = [('bucket', 0.0, 2e-3, 1000), ('bucket', 1e-3, 4e-3, 500),
             ('wait', 4e-3, 9e-3, None)]
    rank1 = [('bucket', 0.0, 2e-3, 1000), ('bucket', 1e-3, 4e-3, 500),
             ('wait', 4e-3, 5e-3, None)]
    text = timeline.summarize(timeline.to_trace([rank0, rank1]))
    assert 'no allreduce recorded' not in text
    assert ('allreduce overlapped with backward: 2 buckets a rank, 1,500 '
            'bytes, 5.000 ms in flight') in text, text
    assert ('waiting after backward for the buckets (and the slower rank): '
            'ms per rank: 0 5.000, 1 1.000') in text, text
    # After backward: the header's sync is the wait.
    text = timeline.summarize(timeline.to_trace(
        [[('sync', 0, 7e-3, None), ('allreduce', 7e-3, 8e-3, 8)],
         [('sync', 6e-3, 7e-3, None), ('allreduce', 7e-3, 8e-3, 8)]]))
    assert ('waiting in the header for the slower rank: ms per rank: '
            '0 7.000, 1 1.000') in text, text


def test_record_writes_trace_and_summary(tmp_path):
    printed = []
    path = tmp_path / 'trace.json'
    with timeline.record(path, ONE, out=printed.append) as rec:
        assert timeline.active is rec
        t = rec.start()
        t = rec.stop('pack', t, 16)
        rec.stop('allreduce', t, 16)
    assert timeline.active is None
    data = json.loads(path.read_text())
    names = [e['name'] for e in data['traceEvents'] if e['ph'] == 'X']
    assert names == ['pack', 'allreduce']
    assert len(printed) == 1 and 'busbw' in printed[0]
    assert str(path) in printed[0]
    assert rec.finish() is None  # once only


def test_record_that_raises_writes_nothing(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with timeline.record(tmp_path / 't.json', ONE, out=None):
            1 / 0
    assert timeline.active is None
    assert not (tmp_path / 't.json').exists()


def test_one_recording_at_a_time(tmp_path):
    with timeline.record(tmp_path / 'a.json', ONE, out=None):
        with pytest.raises(RuntimeError, match='already recording'):
            timeline.start(tmp_path / 'b.json', ONE)


def test_environment_variable_and_finalize(tmp_path, monkeypatch):
    path = tmp_path / 'env.json'
    monkeypatch.delenv(timeline.ENV, raising=False)
    timeline.start_from_env(ONE)
    assert timeline.active is None
    monkeypatch.setenv(timeline.ENV, str(path))
    owner = types.SimpleNamespace(rank=0, size=1)
    timeline.start_from_env(owner)
    rec = timeline.active
    assert rec is not None and rec.owner is owner
    timeline.start_from_env(ONE)  # a second communicator: no new recording
    assert timeline.active is rec
    rec._print = None
    timeline.finish_owned(ONE)  # not the owner
    assert timeline.active is rec and not path.exists()
    timeline.finish_owned(owner)
    assert timeline.active is None and path.exists()


class _FakeComm:
    """Stands for a communicator: records the calls, moves nothing."""

    def __init__(self):
        self.calls = []

    def bcast_data(self, model):
        self.calls.append('bcast_data')

    def multi_node_mean_grad(self, model, zero_fill=False):
        self.calls.append('mean_grad')

    def wait_until(self, done, what, on_stall=None):  # the NaN check's read
        assert done()


def _names(rec):
    return [e[0] for e in rec.events]


def test_optimizer_times_forward_backward_update(tmp_path):
    model = MLP()
    x = numpy.ones((2, 5), numpy.float32)
    t = numpy.zeros(2, numpy.int32)
    comm = _FakeComm()
    opt = create_multi_node_optimizer(optimizers.SGD(), comm).setup(model)

    def lossfun(x, t):
        return F.softmax_cross_entropy(model(x), t)
    opt.update(lossfun, x, t)  # not recorded: nothing is active
    with timeline.record(tmp_path / 't.json', ONE, out=None) as rec:
        opt.update(lossfun, x, t)
        assert _names(rec) == ['forward', 'backward', 'update']
        opt.update()  # without a loss function: the update alone
    assert _names(rec) == ['forward', 'backward', 'update', 'update']
    starts = [e[1] for e in rec.events]
    ends = [e[2] for e in rec.events]
    assert starts == sorted(starts) and all(
        s <= e for s, e in zip(starts, ends))
    assert ends[0] <= starts[1]  # backward starts after forward ends
    assert comm.calls == ['bcast_data', 'mean_grad', 'mean_grad']


def test_span_while_off_is_one_shared_object_and_reads_no_clock(monkeypatch):
    def no_clock():
        raise AssertionError('the clock was read with the timeline off')
    monkeypatch.setattr(timeline.time, 'perf_counter', no_clock)
    spans = [timeline.span('pack', 64), timeline.span('update', sync=True),
             hooks.no_span('reduce', 8, sync=True)]
    assert all(s is timeline.NO_SPAN for s in spans)
    for s in spans:
        with s as inside:
            assert inside is timeline.NO_SPAN


def test_span_records_its_block(tmp_path):
    with timeline.record(tmp_path / 't.json', ONE, out=None) as rec:
        with timeline.span('pack', 16):
            pass
        with timeline.span('allreduce', 16):  # stages nest inside a step
            with timeline.span('reduce', 16):
                pass
            with hooks.no_span('bcast', 16):
                pass
        with timeline.span('forward'):
            pass
    assert [(e[0], e[3]) for e in rec.events] == [
        ('pack', 16), ('reduce', 16), ('allreduce', 16), ('forward', None)]
    pack, reduce, allreduce, forward = rec.events
    assert pack[1] <= pack[2] <= allreduce[1] <= reduce[1] <= reduce[2] \
        <= allreduce[2] <= forward[1] <= forward[2]


def test_a_span_that_raises_records_nothing(tmp_path):
    with timeline.record(tmp_path / 't.json', ONE, out=None) as rec:
        with pytest.raises(ZeroDivisionError):
            with timeline.span('pack', 8):
                1 / 0
        assert rec.events == []
