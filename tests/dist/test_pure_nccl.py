"""pure_nccl pieces that need neither MPI nor a GPU: the bfloat16 wire."""
import types

import numpy
import pytest

from minichain.dist.pure_nccl import from_bfloat16_bits, to_bfloat16_bits

# CUDA's canonical NaN (0x7FFFFFFF, and 0xFFFFFFFF with the sign), x86's
# (0xFFC00000), a NaN with only low mantissa bits (rounds to inf with the
# bias), the largest NaN mantissa of each sign.
NAN_BITS = [0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xFFC00000, 0x7F800001,
            0xFF800001, 0x7FBFFFFF, 0xFFBFFFFF]


def _f32(bits):
    return numpy.array(bits, numpy.uint32).view(numpy.float32)


def test_bfloat16_keeps_every_nan_pattern():
    b16 = to_bfloat16_bits(_f32(NAN_BITS))
    assert b16.dtype == numpy.uint16
    assert ((b16 & 0x7FFF) > 0x7F80).all(), [hex(b) for b in b16]
    assert list(b16 >> 15) == [b >> 31 for b in NAN_BITS]  # sign kept
    assert numpy.isnan(from_bfloat16_bits(b16)).all()
    assert not numpy.isfinite(from_bfloat16_bits(b16)).any()


def test_bfloat16_infinities_and_overflow_round_as_before():
    bits = [0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x7F7F7FFF, 0x00000001]
    b16 = to_bfloat16_bits(_f32(bits))
    # inf stays inf; the largest float32 rounds up to inf (nearest even);
    # just under the halfway point stays finite; the smallest subnormal
    # rounds to +0
    assert [hex(b) for b in b16] == ['0x7f80', '0xff80', '0x7f80', '0x7f7f',
                                     '0x0']


def test_bfloat16_finite_values_round_to_nearest_even():
    rng = numpy.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 100000, dtype=numpy.uint64).astype(
        numpy.uint32)
    x = bits.view(numpy.float32)
    finite = numpy.isfinite(x)
    b16 = to_bfloat16_bits(x)
    want = ((bits.astype(numpy.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16)
    assert (b16[finite] == want[finite].astype(numpy.uint16)).all()
    back = from_bfloat16_bits(b16)
    assert (numpy.isnan(back) == numpy.isnan(x)).all()
    big = finite & (numpy.abs(x) < 1e38) & (numpy.abs(x) > 1e-30)
    assert (numpy.abs(back[big] - x[big]) <= numpy.abs(x[big]) * 2 ** -8).all()


class _Event:
    def __init__(self, log, name):
        self.log, self.name, self.done = log, name, True


class _Stream:
    """A CUDA stream's calls that pure_nccl makes (the names of CuPy's
    Stream: record, ptr)."""
    ptr = 0

    def __init__(self, log):
        self.log = log

    def record(self):
        self.log.append('record')
        return _Event(self.log, 'event {}'.format(self.log.count('record')))


class _DeviceArray(numpy.ndarray):
    """A NumPy array with a CuPy array's ``data.ptr``."""
    data = property(lambda self: types.SimpleNamespace(ptr=0))


@pytest.mark.mpi(ranks=[2])
def test_an_allreduce_waits_for_the_nccl_work_in_flight(monkeypatch):
    """``allreduce`` of a CuPy array recorded its event over the one of the
    averaging before it without waiting for that: NCCL work that a rank
    never joined then went unwatched, and the host hung at its next
    synchronization, outside the watchdog. CuPy and NCCL are stand-ins
    with CuPy's names (no GPU here); MPI is real (the allreduce's header)."""
    import contextlib
    from minichain import backend, dist
    from minichain.dist import pure_nccl
    log = []
    stream = _Stream(log)
    def array(x, copy, order):
        return numpy.array(x, copy=copy, order=order).view(_DeviceArray)
    cupy = types.SimpleNamespace(array=array, cuda=types.SimpleNamespace(
        Device=lambda device: contextlib.nullcontext(),
        get_current_stream=lambda: stream))
    nccl = types.SimpleNamespace(NCCL_FLOAT32=7, NCCL_SUM=0)
    monkeypatch.setattr(backend, 'get_cupy', lambda: cupy)
    monkeypatch.setattr(backend, 'get_array_module', lambda *a: cupy)
    monkeypatch.setattr(pure_nccl, 'nccl_module', lambda: nccl)
    comm = dist.create_communicator('pure_nccl')
    comm.nccl_comm, comm.nccl_device = types.SimpleNamespace(
        allReduce=lambda *args: log.append('allReduce')), -1
    waited = []
    monkeypatch.setattr(comm, 'wait_nccl',
                        lambda event, what, wire=None: waited.append(event))
    previous = comm.in_flight = _Event(log, 'the averaging before')
    out = comm.allreduce(numpy.ones(3, numpy.float32), 'mean')
    assert waited == [previous]  # under the watchdog, before its own
    assert log == ['allReduce', 'record'] and comm.in_flight.name == 'event 1'
    assert out.tolist() == [0.5] * 3  # (the stand-in NCCL sums nothing)
    comm.allreduce(numpy.ones(3, numpy.float32))
    assert waited[-1].name == 'event 1'
    comm.nccl_comm = None  # nothing to destroy
    comm.finalize()
