"""Every CPU kernel against its op's body on hostile inputs.

The kernels' contract (minichain/kernels/__init__.py, docs/kernels.md):
a kernel returns what the body returns, or declines. The other kernel
tests hold each kernel to its body at the shapes ResNet-50 gives it, in
the layouts a training step gives it; this one tries what a user can
hand an op and a training step never does. Each *program* below runs one
family of ops through the public API (forward, backward, and the double
backward where a node only appears there), on small random shapes and
hyper-parameters, and records every node that has a CPU kernel, as
test_kernels_equal_bodies.py does. Each recorded node is then run by
every CPU kernel registered for it (NumPy, oneDNN, and oneDNN's
unregistered ones) beside its body, several times, each time with every
input array in a random view of the same logical values (_hostile.py):

- C order, Fortran order, a random order of the axes (channels-last and
  channel-major among them), an offset into a larger array, steps of 2
  and 3, reversed axes (negative strides), a broadcast axis (a zero
  stride), an address that is not a multiple of 4 bytes, big-endian
  bytes, a read-only array;

and, in some of those runs, special values among them: NaN, +inf, -inf,
-0.0, +0.0 and ties. A kernel either declines (returns None) or passes
``testing.assert_kernel_equals_body`` with the tolerance of
test_kernels_equal_bodies.py (derived from the finite inputs): the same
bits, the sign of zero included, where the op has no sums; elsewhere NaN
and infinities where the body has them (either of them where a kernel
computes by another formula: ``OTHER_FORMULAS``), finite values within
rounding. MomentumSGD's update kernel is held to ``update_core`` the
same way (``testing.assert_update_equals_body``).

Speed thresholds (the sizes under which a kernel declines because the
body was faster) are set to 0 here so that the small shapes exercise the
kernels; every kernel must take at least one case. ``COVERED`` lists the
kernels this file drives; a kernel registered for the CPU without an
entry there fails ``test_every_cpu_kernel_is_covered``.
"""
import copy
import os
from types import SimpleNamespace

import ml_dtypes
import numpy
import pytest

import minichain
from minichain import functions as F
from minichain import kernel_seam, kernels, optimizers, using_config
from minichain.functions import activation as _act
from minichain.functions import array as _array
from minichain.functions import basic_math as _math
from minichain.functions import convolution as _conv
from minichain.functions.linear import LinearFunction
from minichain.functions import normalization as _norm
from minichain.functions import pooling as _pool
from minichain.kernels import testing
from minichain.optimizers.momentum_sgd import MomentumSGDRule
from tests._holder import Holder
from tests.kernels._hostile import finite, variants
from tests.kernels.test_kernels_equal_bodies import _tolerances

try:
    from minichain.kernels import onednn
    ONEDNN = onednn.available()
except ImportError:   # the layer's folder removed: its kernels are gone
    onednn, ONEDNN = None, False

CPU = ('numpy', 'onednn')
# Programs run per test, each node's inputs in 8 variants; the seed moves
# with MINICHAIN_PROPERTY_SEED, to search further than CI does.
ROUNDS = 20
SEED = int(os.environ.get('MINICHAIN_PROPERTY_SEED', 0))
F32 = numpy.float32
TINY = float(numpy.finfo(F32).tiny)
# NaN and infinities in the arithmetic are the point here
pytestmark = pytest.mark.filterwarnings('ignore::RuntimeWarning')


# -- recording the nodes a program makes -------------------------------------
def _has_cpu_kernel(node_type):
    return any(_kernel(node_type, b) is not None for b in CPU) or (
        onednn is not None and node_type in dict(onednn.UNREGISTERED))


def _kernel(node_type, backend):
    k = kernels.registered(node_type, backend)
    if backend == 'onednn' and onednn is not None and node_type in dict(
            onednn.BF16_ONLY):
        k = None  # registered for bf16 compute only: its float32 path
    if k is None and backend == 'onednn' and onednn is not None:
        k = dict(onednn.UNREGISTERED).get(node_type)
        if k is not None:
            k = onednn._gated(k)
    return k


def record(program):
    """[(unapplied node, input copies)] of the nodes with a CPU kernel
    that ``program()`` applies (kernels off: the bodies make them)."""
    seen = []
    real = kernel_seam.forward

    def spy(node, inputs):
        if _has_cpu_kernel(type(node)):
            seen.append((copy.deepcopy(node),
                         tuple(testing._copy(a) for a in inputs)))
        return real(node, inputs)
    kernel_seam.forward = spy  # the seam FunctionNode.apply calls
    try:
        with using_config('use_kernels', False):
            program()
    finally:
        kernel_seam.forward = real
    return seen


# -- the programs -------------------------------------------------------------
def _rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F32)


def _backward(y, rng):
    y.grad = _rand(rng, y.shape)
    y.backward()


def convolution_program(rng):
    n, c, groups = int(rng.integers(1, 3)), int(rng.integers(1, 4)), 1
    if rng.random() < 0.3:
        groups, c = 2, 2 * c
    o = groups * int(rng.integers(1, 4))
    k = tuple(int(v) for v in rng.integers(1, 4, 2))
    stride = tuple(int(v) for v in rng.integers(1, 3, 2))
    pad = tuple(int(v) for v in rng.integers(0, 2, 2))
    dilate = int(rng.integers(1, 3))
    h, w = (int(v) for v in rng.integers(5, 9, 2))
    x = minichain.Variable(_rand(rng, (n, c, h, w)))
    W = minichain.Variable(_rand(rng, (o, c // groups) + k, 0.5))
    b = minichain.Variable(_rand(rng, (o,))) if rng.random() < 0.7 else None
    cover_all = bool(rng.random() < 0.3)
    y = F.convolution_2d(x, W, b, stride=stride, pad=pad, dilate=dilate,
                         cover_all=cover_all, groups=groups)
    _backward(y, rng)
    # a deconvolution with a bias of its own
    bd = minichain.Variable(_rand(rng, (c,)))
    F.deconvolution_2d(y.array, W.array, bd, stride=stride, pad=pad,
                       outsize=(h, w), dilate=dilate, groups=groups)


def batch_normalization_program(rng):
    n, c, h, w = (int(v) for v in rng.integers(2, 5, 4))
    x = minichain.Variable(_rand(rng, (n, c, h, w), 2.0) + F32(1))
    gamma, beta = (minichain.Variable(_rand(rng, (c,))) for _ in range(2))
    residual = (minichain.Variable(_rand(rng, x.shape))
                if rng.random() < 0.4 else None)
    running = [numpy.zeros(c, F32), numpy.ones(c, F32)]
    y = F.batch_normalization(x, gamma, beta, running_mean=running[0],
                              running_var=running[1], residual=residual,
                              relu=bool(rng.random() < 0.5))
    _backward(y, rng)
    var = numpy.abs(_rand(rng, (c,))) + F32(0.5)
    F.fixed_batch_normalization(x.array, gamma.array, beta.array,
                                _rand(rng, (c,)), var)


def relu_program(rng):
    x = minichain.Variable(_rand(rng, tuple(
        int(v) for v in rng.integers(1, 6, int(rng.integers(1, 5))))))
    _backward(F.relu(x), rng)


def pooling_program(rng):
    n, c = (int(v) for v in rng.integers(1, 4, 2))
    h, w = (int(v) for v in rng.integers(4, 9, 2))
    k = tuple(int(v) for v in rng.integers(1, 4, 2))
    stride = tuple(int(v) for v in rng.integers(1, 3, 2))
    pad = tuple(min(int(v), kk - 1) for v, kk in zip(rng.integers(0, 2, 2),
                                                     k))
    x = minichain.Variable(_rand(rng, (n, c, h, w)))
    y = F.max_pooling_2d(x, k, stride, pad, cover_all=bool(rng.random() < .5))
    _backward(y, rng)
    # the gather of double backprop (MaxPooling2DGrad's backward)
    _pool.MaxPooling2DGather(y.creator.g, y.creator.indexes).apply(
        (_rand(rng, x.shape),))
    _backward(F.average_pooling_2d(x, k, stride, pad), rng)
    F.global_average_pooling_2d(x.array)


def add_program(rng):
    # sums of two arrays in one layout or two, broadcast at times, and the
    # sum of gradients of a variable with two consumers
    shape = tuple(int(v) for v in rng.integers(1, 6, int(rng.integers(1, 5))))
    a = _rand(rng, shape)
    order = tuple(rng.permutation(len(shape)))
    b = numpy.ascontiguousarray(_rand(rng, shape).transpose(order)
                                ).transpose(numpy.argsort(order))
    if rng.random() < 0.3:
        b = b[(slice(None),) * (len(shape) - 1) + (slice(0, 1),)]
    F.add(a, b)
    x = minichain.Variable(_rand(rng, shape))
    _backward(F.relu(x) * x + x, rng)


def linear_program(rng):
    n, i, o = (int(v) for v in rng.integers(1, 7, 3))
    x = minichain.Variable(_rand(rng, (n, i)))
    W = minichain.Variable(_rand(rng, (o, i)))
    b = minichain.Variable(_rand(rng, (o,))) if rng.random() < 0.7 else None
    _backward(F.linear(x, W, b), rng)
    F.matmul(_rand(rng, (2, n, i)), _rand(rng, (i, o)))


def cast_program(rng):
    # float32 <-> bfloat16 (mixed16's casts on the CPU) in any layout, and
    # a cast no kernel takes (float16)
    shape = tuple(int(v) for v in rng.integers(1, 6, int(rng.integers(1, 5))))
    x = _rand(rng, shape)
    x[rng.random(shape) < 0.3] *= TINY    # denormals (and their rounding)
    x = minichain.Variable(x)
    _backward(F.cast(F.cast(x, ml_dtypes.bfloat16) * 2, 'float32'), rng)
    F.cast(_rand(rng, shape), numpy.float16)


PROGRAMS = {
    'convolution': (convolution_program, {
        _conv.Convolution2D, _conv.Deconvolution2D,
        _conv.Convolution2DGradW}),
    'batch_normalization': (batch_normalization_program, {
        _norm.BatchNormalization, _norm.BatchNormalizationGrad,
        _norm.FixedBatchNormalization, _act.ReLUGrad}),
    'relu': (relu_program, {_act.ReLU, _act.ReLUGrad}),
    'pooling': (pooling_program, {
        _pool.MaxPooling2D, _pool.MaxPooling2DGrad, _pool.MaxPooling2DGather,
        _pool.AveragePooling2D, _pool.AveragePooling2DGrad,
        _pool.GlobalAveragePooling2D}),
    'linear': (linear_program, {LinearFunction, _math.MatMul}),
    'add': (add_program, {_math.Add}),
    'cast': (cast_program, {_array.Cast}),
}


def momentum_sgd_case(rng):
    """(rule, parameter, gradient): a MomentumSGD rule with random
    hyper-parameters (decay or none), its velocity, a random shape."""
    shape = tuple(int(v) for v in rng.integers(1, 9, int(rng.integers(1, 4))))
    p, g, v = (_rand(rng, shape) for _ in range(3))
    wd = float(rng.choice([0.0, 1e-4, 0.5]))
    opt = optimizers.MomentumSGD(lr=float(rng.uniform(0, 0.5)),
                                 momentum=float(rng.uniform(0, 1)),
                                 weight_decay_rate=wd)
    link = Holder(w=p)
    rule = opt.setup(link).target.w.update_rule
    rule.state = {'v': v}
    return rule, p, g


UPDATE_RULES = {MomentumSGDRule: momentum_sgd_case}
COVERED = set().union(*(types for _, types in PROGRAMS.values()),
                      UPDATE_RULES)


@pytest.fixture(autouse=True)
def _small_sizes_run_the_kernels(monkeypatch):
    if onednn is not None:
        monkeypatch.setattr(onednn.activation, '_MIN_SIZE', 0)
        monkeypatch.setattr(onednn.convolution, '_MIN_PIXELS', 0)
        monkeypatch.setattr(onednn.optimizers, '_MIN_SIZE', 0)
        monkeypatch.setattr(onednn._binary, '_MIN_ADD', 0)
    with using_config('use_onednn', 'auto'):
        yield


def test_every_cpu_kernel_is_covered():
    for backend in CPU:
        kernels.registered(object, backend)  # loads the backend's kernels
    registered = {t for t, b in kernels.registry if b in CPU}
    if onednn is not None:
        registered |= {t for t, _ in onednn.UNREGISTERED}
    missing = sorted(t.__name__ for t in registered - COVERED)
    assert not missing, ('CPU kernels that {} does not drive: add them to '
                         'its PROGRAMS'.format(__name__), missing)


# Kernels that compute by another formula than the body's (batch
# normalization's backward from sums of gy and gy * x): where the body's
# arithmetic meets inf - inf and theirs does not (or the reverse), NaN and
# infinities trade places.
OTHER_FORMULAS = {_norm.BatchNormalizationGrad}


# Ops without sums: the same bits (the sign of zero included). The others'
# tolerance is at least the smallest float, as the sign of a zero sum
# depends on the order of its terms.
NO_SUMS = {_act.ReLU, _act.ReLUGrad, _pool.MaxPooling2D,
           _pool.MaxPooling2DGather, _math.Add}


def _check(kernel, node, inputs):
    """Whether the kernel took the inputs; raises if it took them and
    differs from the body."""
    clean = tuple(finite(a) for a in inputs)
    atol, attr_atol = _tolerances(node, clean)
    if type(node) not in NO_SUMS:
        atol = (tuple(max(t, TINY) for t in atol)
                if isinstance(atol, tuple) else max(atol, TINY))
    return testing.assert_kernel_equals_body(
        kernel, node, inputs, atol=atol, attr_atol=attr_atol,
        hints=('centered', 'relu_workspace'), may_decline=True,
        any_special=type(node) in OTHER_FORMULAS) is not None


@pytest.mark.parametrize('name', sorted(PROGRAMS))
def test_kernels_equal_bodies_or_decline(name):
    program, types = PROGRAMS[name]
    rng = numpy.random.default_rng(SEED + sorted(PROGRAMS).index(name))
    taken, met, failed = {}, set(), []
    for _ in range(ROUNDS):
        for node, inputs in record(lambda: program(rng)):
            met.add(type(node))
            for backend in CPU:
                kernel = _kernel(type(node), backend)
                if kernel is None or (backend == 'onednn' and not ONEDNN):
                    continue
                key = (type(node).__name__, backend)
                for ins, what in variants(inputs, rng, 8):
                    try:
                        ok = _check(kernel, node, ins)
                    except Exception as e:
                        failed.append('{} {} ({}): {}: {}'.format(
                            backend, key[0], what, type(e).__name__, e))
                        ok = False
                    taken[key] = taken.get(key, 0) + ok
    assert not failed, '\n'.join([str(len(failed))] + failed)
    assert met >= types, sorted(t.__name__ for t in types - met)
    idle = sorted(k for k, v in taken.items() if not v)
    assert not idle, ('kernels that declined every case', idle)


@pytest.mark.parametrize('rule_type', sorted(UPDATE_RULES, key=str))
def test_update_kernels_equal_update_core_or_decline(rule_type):
    """An update rule's kernels against its ``update_core``, on parameter,
    gradient and state in random views with special values. The bound is
    that of tests/kernels/test_onednn_update.py: 8 units of roundoff of the
    velocity's terms, and two more of the parameter's."""
    rng = numpy.random.default_rng(SEED)
    eps, taken = float(numpy.finfo(F32).eps), 0
    for backend in CPU:
        kernel = _kernel(rule_type, backend)
        if kernel is None or (backend == 'onednn' and not ONEDNN):
            continue
        for _ in range(ROUNDS):
            rule, p, g = UPDATE_RULES[rule_type](rng)
            hp = rule.hyperparam
            for (p1, g1, v1), what in variants((p, g, rule.state['v']),
                                               rng, 6):
                rule.state = {'v': v1}
                terms = (hp.momentum * abs(finite(v1)) + hp.lr * abs(
                    finite(g1)) + hp.lr * hp.weight_decay_rate * abs(
                        finite(p1))).max()
                atol = 4 * eps * (terms + abs(finite(p1)).max() + terms)
                try:
                    taken += testing.assert_update_equals_body(
                        kernel, rule, SimpleNamespace(array=p1, grad=g1),
                        atol=max(atol, TINY), may_decline=True)
                except AssertionError as e:
                    raise AssertionError('{} ({}): {}'.format(
                        backend, what, e)) from None
    assert taken, 'every case was declined'
