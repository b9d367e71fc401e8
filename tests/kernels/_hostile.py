"""Hostile inputs for the kernel property test (test_kernel_properties.py):
the same logical values in random views, and special values among them."""
import numpy

F32 = numpy.float32
SPECIALS = numpy.array([numpy.nan, numpy.inf, -numpy.inf, -0.0, 0.0], F32)


# -- random views of the same values ----------------------------------------
def _embedded(a, rng):
    """``a``'s values in a view at an offset into a larger array."""
    lo = [int(rng.integers(0, 3)) for _ in a.shape]
    big = numpy.empty([n + s + int(rng.integers(0, 2))
                       for n, s in zip(a.shape, lo)], a.dtype)
    view = big[tuple(slice(s, s + n) for s, n in zip(lo, a.shape))]
    view[...] = a
    return view


def _stepped(a, rng):
    steps = [int(rng.integers(1, 4)) for _ in a.shape]
    big = numpy.empty([n * s for n, s in zip(a.shape, steps)], a.dtype)
    view = big[tuple(slice(None, None, s) for s in steps)]
    view[...] = a
    return view


def _reversed(a, rng):
    axes = tuple(i for i in range(a.ndim) if rng.random() < 0.6) or (0,)
    flipped = numpy.ascontiguousarray(numpy.flip(a, axes))
    return numpy.flip(flipped, axes)


def _permuted(a, rng, order=None):
    order = tuple(rng.permutation(a.ndim)) if order is None else order
    inner = numpy.ascontiguousarray(a.transpose(order))
    return inner.transpose(numpy.argsort(order))


def _broadcast(a, rng):
    """A zero stride: ``a``'s first slice along a random axis, repeated
    (other values, the same shape)."""
    axis = int(rng.integers(0, a.ndim))
    one = numpy.ascontiguousarray(numpy.take(a, [0], axis=axis))
    return numpy.broadcast_to(one, a.shape)


def _unaligned(a, rng):
    raw = numpy.empty(a.nbytes + 1, numpy.uint8)[1:]
    view = raw.view(a.dtype).reshape(a.shape)
    view[...] = a
    assert not view.flags.aligned or a.size == 0
    return view


def _read_only(a, rng):
    a = numpy.array(a)
    a.flags.writeable = False
    return a


def _big_endian(a, rng):
    return a.astype(a.dtype.newbyteorder('>'))


LAYOUTS = {
    'C': lambda a, rng: numpy.ascontiguousarray(a),
    'F': lambda a, rng: numpy.asfortranarray(a),
    'permuted': _permuted,
    'channels-last': lambda a, rng: _permuted(a, rng, (0, 2, 3, 1)),
    'channel-major': lambda a, rng: _permuted(
        a, rng, (1, 0) + tuple(range(2, a.ndim))),
    'offset': _embedded,
    'stepped': _stepped,
    'reversed': _reversed,
    'broadcast': _broadcast,
    'unaligned': _unaligned,
    'big-endian': _big_endian,
    'read-only': _read_only,
}


def _view(a, rng):
    """``a`` (an array, or anything else, returned as it is) in a random
    layout; which one is returned with it."""
    if not isinstance(a, numpy.ndarray) or a.ndim == 0:
        return a, None
    names = [n for n in LAYOUTS if (a.ndim == 4 or n != 'channels-last')
             and (a.ndim > 1 or n != 'channel-major')]
    name = names[int(rng.integers(0, len(names)))]
    return LAYOUTS[name](a, rng), name


def _special(a, rng):
    """A copy of ``a`` with NaN, infinities, signed zeros and ties at
    random places."""
    a = a.copy()
    flat = a.reshape(-1)
    if rng.random() < 0.3:   # ties: a few levels only
        flat[...] = numpy.round(flat * 2) / 2
    k = max(1, flat.size // 20)
    at = rng.integers(0, flat.size, k)
    flat[at] = rng.choice(SPECIALS, k)
    return a


def finite(a):
    """``a`` with NaN and infinities replaced by 0 (for tolerances)."""
    if isinstance(a, numpy.ndarray) and a.dtype.kind == 'f':
        return numpy.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    return a


def variants(inputs, rng, n):
    """``n`` (inputs, description): the inputs in random views, special
    values in some of them in every other one; the first two finite, in C
    order and channels-last (the oneDNN kernels' layout for 4-D arrays),
    the third channels-last too."""
    out = []
    for i in range(n):
        ins, what = [], []
        for a in inputs:
            if not isinstance(a, numpy.ndarray) or a.ndim == 0:
                ins.append(a)
                continue
            special = (a.dtype.kind == 'f' and i % 2 == 0 and i > 0
                       and rng.random() < 0.7)
            if special:
                a = _special(a, rng)
            if i < 3:
                name = 'channels-last' if i and a.ndim == 4 else 'C'
                a = LAYOUTS[name](a, rng)
            else:
                a, name = _view(a, rng)
            ins.append(a)
            what.append(name + ('+special' if special else ''))
        out.append((tuple(ins), ', '.join(what)))
    return out
