"""oneDNN kernel of MomentumSGD's update (optimizers/momentum_sgd.py).

The update is memory-bound: per element it reads the parameter, its
gradient and its velocity and writes two of them back, and it does no
more arithmetic than that. The body, in NumPy ufuncs one after another,
passes over the arrays 15 times with weight decay (10 without), about
1.4 GB per step for ResNet-50's 23.5 million parameters; here two
oneDNN binary primitives pass 7 times (5):

    v     <- mu * v + (-lr) * g + (-lr * wd) * param    (one pass)
    param <- param + v                                 (in place)

The first is a binary add of ``g`` and ``param`` with their scales given
at execute time (the learning rate changes every iteration; a primitive
built per rate would be built every step), and a *sum post-op* of scale
``mu`` that adds the old ``v`` as it writes the new one. Without weight
decay it is ``v <- mu * v + (-lr) * g`` in place, both scales at
execute time (``param`` is not read: ``0 * inf`` would be NaN where the
body stays finite). The primitives are cached per size and form; they
see every array as one flat run of float32. The sum post-op's scale is
fixed when a primitive is created (oneDNN 3.2 has no execute-time scale
for it), so the momentum is part of the first form's primitive: one per
size is kept, for the latest momentum, and a momentum schedule rebuilds
it when the momentum moves (``_plan.cached``'s slots).

Rounded differently from the body (``lr * wd`` is one float32 scale here,
the products are fused), by a few units in the last place of the terms:
tests/kernels/test_onednn_update.py bounds it. Declined: other dtypes,
arrays that are not C-contiguous, a read-only parameter or velocity
(the body raises), and arrays under ``_MIN_SIZE`` elements (batch
normalization's scales and shifts: two executes cost more than NumPy's
few ufunc calls there).
"""
import numpy

from minichain.kernels.onednn import _dnnl as L
from minichain.kernels.onednn._binary import Attr, binary_add
from minichain.kernels.onednn._plan import cached

# Below this many elements the body was as fast or faster: two executes
# through ctypes cost about 40 us (body / oneDNN 0.58x at 4096, 0.87x at
# 65536, 1.23x at 262144, 1.48x at 1048576 elements; one thread, Intel
# Xeon, 2026-12-03, bench/onednn_update.py).
_MIN_SIZE = 131072
_SCALE_0 = L.ARG_ATTR_SCALES | L.ARG_SRC
_SCALE_1 = L.ARG_ATTR_SCALES | L.ARG_SRC_1


def _velocity(n, momentum):
    """v <- momentum * v + s_0 * g + s_1 * param (with weight decay)."""
    return binary_add(n, Attr((L.ARG_SRC, L.ARG_SRC_1), momentum),
                      (_SCALE_0, _SCALE_1))


def _velocity_plain(n):
    """v <- s_0 * v + s_1 * g, in place (without weight decay)."""
    return binary_add(n, Attr((L.ARG_SRC, L.ARG_SRC_1)), (_SCALE_0, _SCALE_1))


def _scale(value):
    """An execute-time scale: a float32 array of one element."""
    return numpy.array([value], numpy.float32)


def _flat_f32(a):
    return (a.dtype == numpy.float32 and a.flags.c_contiguous
            and a.size >= _MIN_SIZE)


def momentum_sgd(rule, param):
    """Update ``param`` in place as ``MomentumSGDRule.update_core`` does;
    True when done, None to decline."""
    hp = rule.hyperparam
    p, g, v = param.array, param.grad, rule.state['v']
    if not (_flat_f32(p) and _flat_f32(g) and _flat_f32(v)
            and p.shape == g.shape == v.shape
            and p.flags.writeable and v.flags.writeable):
        return None
    n, mu = p.size, float(hp.momentum)
    p1, g1, v1 = p.reshape(-1), g.reshape(-1), v.reshape(-1)
    if hp.weight_decay_rate:
        velocity = cached(('momentum_sgd', n, mu),
                          lambda: _velocity(n, mu),
                          slot=('momentum_sgd', n))
        args = {L.ARG_SRC: g1, L.ARG_SRC_1: p1, L.ARG_DST: v1,
                _SCALE_0: _scale(-hp.lr),
                _SCALE_1: _scale(-hp.lr * hp.weight_decay_rate)}
    else:
        velocity = cached(('momentum_sgd_plain', n),
                          lambda: _velocity_plain(n))
        args = {L.ARG_SRC: v1, L.ARG_SRC_1: g1, L.ARG_DST: v1,
                _SCALE_0: _scale(mu), _SCALE_1: _scale(-hp.lr)}
    move = cached(('add', n), lambda: binary_add(n))
    if velocity is None or move is None:
        return None
    velocity(args)
    move({L.ARG_SRC: p1, L.ARG_SRC_1: v1, L.ARG_DST: p1})
    return True
