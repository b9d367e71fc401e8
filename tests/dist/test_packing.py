"""Packing gradients: a small host range packed in one concatenate gives
the same bits as the multiply per segment."""
import numpy
import pytest

import minichain
from minichain.dist import packing


def _entries(dtype, none_at=None):
    rng = numpy.random.default_rng(0)
    out = []
    for i, n in enumerate((3, 1000, 7, 5000, 1)):
        p = minichain.Parameter(numpy.zeros(n, dtype))
        if i != none_at:
            p.grad = rng.standard_normal(n).astype(dtype)
        out.append((str(i), p, p.grad))
    return out


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
@pytest.mark.parametrize('none_at', [None, 2])
@pytest.mark.parametrize('lo, hi', [(0, None), (2, 1500), (1000, 6011)])
def test_small_ranges_pack_the_same_bits(monkeypatch, dtype, none_at, lo,
                                         hi):
    entries = _entries(dtype, none_at)
    out = {}
    for small in (1 << 20, 0):  # the one-concatenate path, then without
        monkeypatch.setattr(packing, 'SMALL_BYTES', small)
        packer = packing.Packer(entries)
        buf = numpy.full(packer.total, 7, dtype)
        packer.pack(buf, 1 / 3, lo, hi)
        out[small] = buf
    assert numpy.array_equal(out[0].view(numpy.uint8),
                             out[1 << 20].view(numpy.uint8))
    want = numpy.concatenate([numpy.zeros(p.size, dtype) if g is None
                              else g / 3 for _, p, g in entries])
    stop = len(want) if hi is None else hi
    numpy.testing.assert_allclose(out[0][lo:stop], want[lo:stop], rtol=1e-6)
    assert (out[0][:lo] == 7).all() and (out[0][stop:] == 7).all()
