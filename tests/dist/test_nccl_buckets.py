"""The order in which NcclBuckets queues its GPU work, recorded on fake
streams (no GPU, no MPI): what a CUDA event covers is exactly the work
queued on its stream before it, so the order of the calls is the contract."""
import types

import numpy
import pytest

from minichain import backend
from minichain.dist import nccl_buckets


class Event:
    def __init__(self, number):
        self.number, self.done = number, True

    def __repr__(self):
        return 'event{}'.format(self.number)


class Stream:
    """Appends every call to the shared log: ('record', stream, event),
    ('wait', stream, event)."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def record(self):
        event = Event(sum(1 for e in self.log if e[0] == 'record'))
        self.log.append(('record', self.name, event))
        return event

    def wait_event(self, event):
        self.log.append(('wait', self.name, event))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Comm:
    """What the buckets use of a PureNcclCommunicator."""

    def __init__(self, log, wire_dtype):
        self.log, self.wire_dtype_ = log, wire_dtype
        self.in_flight = None

    def init_nccl(self, device):
        pass

    def transfer_dtype(self, entries):
        return self.wire_dtype_

    def sum_on_device(self, nccl, wire, kind, stream):
        self.log.append(('allreduce', stream.name, wire.dtype.name))

    def wait_in_flight(self):
        self.log.append(('host waits', self.in_flight))
        self.in_flight = None

    def wait_nccl(self, event, what, wire=None):
        self.log.append(('host waits', event))

    def bucket_wire(self):
        return None


@pytest.fixture
def log(monkeypatch):
    log = []
    streams = iter(['side', 'copy'])
    compute = Stream(log, 'compute')

    class Device:
        def __init__(self, device):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    cuda = types.SimpleNamespace(
        Device=Device, get_current_stream=lambda: compute,
        Stream=lambda non_blocking: Stream(log, next(streams)))
    fake = types.SimpleNamespace(
        cuda=cuda, stack=numpy.stack, isfinite=numpy.isfinite,
        empty=numpy.empty)
    monkeypatch.setattr(backend, 'get_cupy', lambda: fake)
    nccl = types.SimpleNamespace(NCCL_FLOAT32=7, NCCL_BFLOAT16=9)
    monkeypatch.setattr(nccl_buckets, 'nccl_module', lambda: nccl)
    convert = nccl_buckets.from_bfloat16_bits

    def logged_convert(bits):
        log.append(('convert', 'side'))
        return convert(bits)
    monkeypatch.setattr(nccl_buckets, 'from_bfloat16_bits', logged_convert)
    return log


def _bucket(log):
    packer = types.SimpleNamespace(
        pack=lambda buf, scale: log.append(('pack', 'side')))
    return types.SimpleNamespace(buf=numpy.ones(4, numpy.float32), nbytes=8,
                                 packer=packer, work=None)


@pytest.mark.parametrize('wire_dtype', ['bfloat16', numpy.dtype('float32')])
def test_done_event_is_recorded_after_the_conversion_back(log, wire_dtype):
    """bfloat16: the event the compute stream waits for is recorded after
    the bits are converted back to float32 (it was recorded before: the
    update could read this rank's own gradient, and the finite check miss
    another rank's NaN)."""
    comm = Comm(log, wire_dtype)
    buckets = nccl_buckets.NcclBuckets(comm, 0)
    buckets.dtypes([('w', None)])
    bucket = _bucket(log)
    buckets.start(bucket, 0.5)
    done = bucket.work.done
    steps = [e[:2] for e in log]
    at_done = log.index(('record', 'side', done))
    assert steps.index(('allreduce', 'side')) < at_done
    if wire_dtype == 'bfloat16':
        assert steps.index(('convert', 'side')) < at_done
    buckets.complete(bucket)
    assert log[-1] == ('wait', 'compute', done)
    assert comm.in_flight is done  # the next averaging polls it


def test_the_next_averaging_and_the_check_wait_under_the_watchdog(log):
    comm = Comm(log, 'bfloat16')
    buckets = nccl_buckets.NcclBuckets(comm, 0)
    buckets.dtypes([('w', None)])
    bucket = _bucket(log)
    buckets.start(bucket, 0.5)
    buckets.complete(bucket)
    buckets.check([bucket])
    assert log[-1][0] == 'host waits'  # before the host reads the flags
    first = comm.in_flight
    buckets.start(_bucket(log), 0.5)
    assert ('host waits', first) in log
