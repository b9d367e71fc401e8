"""``config.fp32_math = 'bf16'`` on oneDNN (minichain/kernels/onednn/
_fpmath.py): the convolution and inner product kernels take and return
float32 and compute with bfloat16 factors and float32 sums where the CPU
has bfloat16 dot products; elsewhere they compute float32 and say so once.

The bound of a bf16 result: each product of two factors rounded to
bfloat16 is off by at most ``2u + u^2`` of its magnitude (u = 2^-8,
bfloat16's unit roundoff: 8 significant bits), and the float32 sums add
``K * u32`` as in float32, so ``|bf16 - body| <= (2u + u^2 + 2 K u32) *
body(|x|, |W|)``: a wrong layout or a float32 primitive that rounds
nothing (the same bits as strict) fails it or the test that they differ.
"""
import os
import subprocess
import sys
import warnings

import numpy
import pytest

import minichain
from minichain import functions as F
from minichain import using_config
from minichain.functions import convolution as C
from minichain.functions.basic_math import MatMul
from minichain.functions.linear import LinearFunction
from tests.kernels.test_onednn import (  # noqa: F401 (a fixture)
    CONVS, every_size, onednn)

from minichain.kernels.onednn import _fpmath as fpmath  # noqa: E402
U32 = float(numpy.finfo(numpy.float32).eps) / 2
U16 = 2.0 ** -8           # bfloat16's unit roundoff
# oneDNN 3.2 computes bfloat16 arrays on AVX512 (with AVX512_BF16 or not)
AVX512 = fpmath.effective_isa()[1] & 0x27 == 0x27
needs_bf16 = pytest.mark.skipif(
    not fpmath.has_bf16(), reason='oneDNN dispatches to {}: no bfloat16 '
    'dot products (the fallback is tested below)'.format(
        fpmath.effective_isa()[0]))


@pytest.fixture(autouse=True)
def onednn_on():
    with using_config('use_onednn', 'auto'):
        yield


def _rand(rng, shape):
    return rng.standard_normal(shape).astype(numpy.float32)


def _bf16_bound(make_node, inputs, terms):
    ref = make_node().forward(tuple(numpy.abs(a) for a in inputs))[0]
    return (2 * U16 + U16 ** 2 + 2 * terms * U32) * ref + 1e-30


def _run(make_node, inputs):
    """The oneDNN kernel's output (the kernel itself, not its gate)."""
    node = make_node()
    kernel = minichain.kernels.registered(type(node), 'onednn').__wrapped__
    out = kernel(node, inputs)
    assert out is not None, [a.shape for a in inputs]
    return out[0]


def _check(make_node, inputs, terms):
    """Run the kernel under bf16 and strict; the bf16 result is within the
    bound of the body's and differs from the strict one."""
    ref, = make_node().forward(inputs)
    with using_config('fp32_math', 'bf16'):
        got = _run(make_node, inputs)
    with using_config('fp32_math', 'strict'):
        strict = _run(make_node, inputs)
    assert got.dtype == numpy.float32 and got.shape == ref.shape
    assert numpy.all(abs(got - ref) <= _bf16_bound(make_node, inputs,
                                                   terms))
    assert not numpy.array_equal(got, strict)   # bfloat16 did round
    return got, strict


@needs_bf16
@pytest.mark.usefixtures('every_size')    # the sizes declined for speed too
@pytest.mark.parametrize('spec', CONVS[::3], ids=lambda s:
                         'n{}c{}h{}o{}k{}s{}p{}'.format(*s))
def test_convolutions_compute_in_bf16_within_its_bound(spec):
    n, c, h, o, k, s, p = spec
    oh = (h + 2 * p - k) // s + 1
    rng = numpy.random.default_rng(sum(spec))
    x, W, b, gy = (_rand(rng, shape) for shape in (
        (n, c, h, h), (o, c, k, k), o, (n, o, oh, oh)))
    stride, pad = (s, s), (p, p)
    _check(lambda: C.Convolution2D(stride, pad, False, (1, 1), 1), (x, W, b),
           c * k * k + 1)
    _check(lambda: C.Deconvolution2D(stride, pad, (h, h), False, (1, 1), 1),
           (gy, W), o * k * k)
    grad_w = lambda: C.Convolution2DGradW(  # noqa: E731
        W.shape, stride, pad, False, (1, 1), 1)
    if c >= onednn.convolution._BF16_GRAD_W_MIN_CHANNELS:
        _check(grad_w, (x, gy), n * oh * oh)
    else:   # an RGB or grey input: float32 (onednn/convolution.py says why)
        with using_config('fp32_math', 'bf16'):
            low = _run(grad_w, (x, gy))
        numpy.testing.assert_array_equal(low, _run(grad_w, (x, gy)))


@needs_bf16
def test_bf16_takes_the_small_maps_where_it_pays():
    # outputs of 2x2 (under _MIN_PIXELS): the forward and backward data of
    # a 3x3 or an unstrided 1x1 run on oneDNN under 'bf16' only; a strided
    # 1x1 and the weight gradient stay with the NumPy kernel
    # (onednn/convolution.py says why)
    rng = numpy.random.default_rng(4)
    x, W, gy = _rand(rng, (2, 8, 2, 2)), _rand(rng, (8, 8, 3, 3)), \
        _rand(rng, (2, 8, 2, 2))
    x4, W1 = _rand(rng, (2, 8, 4, 4)), _rand(rng, (8, 8, 1, 1))
    cases = [
        (True, C.Convolution2D((1, 1), (1, 1), False, (1, 1), 1), (x, W)),
        (True, C.Deconvolution2D((1, 1), (1, 1), (2, 2), False, (1, 1), 1),
         (gy, W)),
        (True, C.Convolution2D((1, 1), (0, 0), False, (1, 1), 1), (x, W1)),
        (False, C.Convolution2D((2, 2), (0, 0), False, (1, 1), 1),
         (x4, W1)),
        (False, C.Convolution2DGradW(W.shape, (1, 1), (1, 1), False, (1, 1),
                                     1), (x, gy))]
    for taken, node, inputs in cases:
        kernel = minichain.kernels.registered(type(node), 'onednn')
        with using_config('fp32_math', 'strict'):
            assert kernel.__wrapped__(node, inputs) is None
        with using_config('fp32_math', 'bf16'):
            assert (kernel.__wrapped__(node, inputs) is not None) == taken


@needs_bf16
@pytest.mark.usefixtures('every_size')    # strict's kernel at 2x2 too
@pytest.mark.parametrize('h,s', [(2, 1), (4, 1), (7, 1), (10, 1), (4, 2),
                                 (7, 2), (20, 2)])
def test_a_1x1_convolution_on_small_maps_is_one_bf16_product(h, s):
    # channels-last x and gy, as the kernels hand them on: to outputs
    # under 10x10 (onednn/_products.py) the inner product's forward,
    # backward data and backward weights, within the same bounds
    n, c, o, oh = 4, 32, 16, (h - 1) // s + 1
    rng = numpy.random.default_rng(h + s)
    x, gy = (onednn._dnnl.empty_channels_last(shape) for shape in (
        (n, c, h, h), (n, o, oh, oh)))
    x[...], gy[...] = _rand(rng, x.shape), _rand(rng, gy.shape)
    W, b, bx = _rand(rng, (o, c, 1, 1)), _rand(rng, o), _rand(rng, c)
    stride, pad = (s, s), (0, 0)
    y, _ = _check(lambda: C.Convolution2D(stride, pad, False, (1, 1), 1),
                  (x, W, b), c + 1)
    gx, _ = _check(lambda: C.Deconvolution2D(stride, pad, (h, h), False,
                                             (1, 1), 1), (gy, W, bx), o + 1)
    _check(lambda: C.Convolution2DGradW(W.shape, stride, pad, False, (1, 1),
                                        1), (x, gy), n * oh * oh)
    small = oh * oh < 100
    assert all(onednn._dnnl.is_channels_last(a) for a in (y, gx))
    f32 = onednn._dnnl.F32
    for key in (('pointwise', n * oh * oh, c, o, True, f32),
                ('pointwise_bwd', n * oh * oh, c, o, f32),
                ('grad_w_product', n * oh * oh, c, o, f32)):
        assert (key + (onednn._dnnl.threads(),) in onednn._plan._cache) \
            == small, key


@needs_bf16
@pytest.mark.usefixtures('every_size')
def test_the_products_take_w_in_any_layout_and_1x1_outputs():
    # a Fortran-ordered W, and x read at one pixel (stride 3 on 2x2),
    # whose (N, C) rows NumPy views with a stride: both copied to the
    # C-ordered matrices the plans read (a fuzz found both)
    rng = numpy.random.default_rng(5)
    x = onednn._dnnl.empty_channels_last((4, 22, 2, 2))
    x[...] = _rand(rng, x.shape)
    W = numpy.asfortranarray(_rand(rng, (17, 22, 1, 1)))
    gy = onednn._dnnl.empty_channels_last((4, 17, 1, 1))
    gy[...] = _rand(rng, gy.shape)
    _check(lambda: C.Convolution2D((3, 3), (0, 0), False, (1, 1), 1), (x, W),
           22)
    _check(lambda: C.Deconvolution2D((3, 3), (0, 0), (2, 2), False, (1, 1),
                                     1), (gy, W), 17)
    _check(lambda: C.Convolution2DGradW(W.shape, (3, 3), (0, 0), False,
                                        (1, 1), 1), (x, gy), 4)
    # shapes that do not agree are the body's to refuse, not read past
    wrong = [(C.Convolution2D((3, 3), (0, 0), False, (1, 1), 1),
              (x, W[:, :21])),
             (C.Deconvolution2D((3, 3), (0, 0), (2, 2), False, (1, 1), 1),
              (gy, W[:16])),
             (C.Convolution2DGradW((17, 21, 1, 1), (3, 3), (0, 0), False,
                                   (1, 1), 1), (x, gy))]
    with using_config('fp32_math', 'bf16'):
        for node, inputs in wrong:
            kernel = minichain.kernels.registered(type(node), 'onednn')
            assert kernel.__wrapped__(node, inputs) is None, node


@needs_bf16
@pytest.mark.usefixtures('every_size')
@pytest.mark.parametrize('h,s', [(2, 1), (4, 2), (3, 1)])
def test_a_3x3_weight_gradient_to_2x2_is_one_bf16_product(h, s):
    # over x's columns, padding zeros included (onednn/_products.py); a
    # 3x3 output is the convolution's kernel's, and so is a gy holding
    # inf (the body's 0 * inf in the padding)
    n, c, o, oh = 4, 16, 8, (h + 2 - 3) // s + 1
    rng = numpy.random.default_rng(h + 10 * s)
    x, gy = (onednn._dnnl.empty_channels_last(shape) for shape in (
        (n, c, h, h), (n, o, oh, oh)))
    x[...], gy[...] = _rand(rng, x.shape), _rand(rng, gy.shape)
    grad_w = lambda: C.Convolution2DGradW(  # noqa: E731
        (o, c, 3, 3), (s, s), (1, 1), False, (1, 1), 1)
    _check(grad_w, (x, gy), n * oh * oh)
    key = ('grad_w_product', n * oh * oh, c * 9, o, onednn._dnnl.F32,
           onednn._dnnl.threads())
    assert (key in onednn._plan._cache) == (oh * oh < 9)
    gy[0, 0, 0, 0] = numpy.inf
    onednn._plan._cache.pop(key, None)
    with using_config('fp32_math', 'bf16'):
        minichain.kernels.registered(type(grad_w()), 'onednn')(grad_w(),
                                                               (x, gy))
    assert key not in onednn._plan._cache


@needs_bf16
@pytest.mark.parametrize('n,i,o', [(32, 2048, 10), (8, 2048, 1000),
                                   (5, 7, 3)])
def test_linear_and_matmul_compute_in_bf16_within_its_bound(n, i, o):
    rng = numpy.random.default_rng(n + i + o)
    x, W, b, gy = (_rand(rng, (n, i)), _rand(rng, (o, i)), _rand(rng, o),
                   _rand(rng, (n, o)))
    _check(LinearFunction, (x, W, b), i + 1)
    _check(MatMul, (gy, W), o)          # gx = gy @ W
    _check(MatMul, (gy.T, x), n)        # gW = gy^T @ x


def test_strict_runs_float32_and_linear_stays_unregistered_there():
    # In strict mode linear and matmul decline (measured mixed in
    # float32: onednn/__init__.py) and the convolutions are float32.
    rng = numpy.random.default_rng(1)
    x, W = _rand(rng, (4, 64)), _rand(rng, (3, 64))
    kernel = minichain.kernels.registered(LinearFunction, 'onednn')
    assert kernel(LinearFunction(), (x, W)) is None


@needs_bf16
def test_primitives_are_cached_per_mode():
    rng = numpy.random.default_rng(2)
    x, W = _rand(rng, (2, 32, 10, 10)), _rand(rng, (32, 32, 3, 3))

    def conv(mode):
        with using_config('fp32_math', mode):
            return F.convolution_2d(x, W, pad=1).array
    first = conv('strict')
    low = conv('bf16')
    again = conv('strict')
    assert not numpy.array_equal(first, low)
    numpy.testing.assert_array_equal(first, again)
    assert 'bf16' in _plans('bf16')[0] and 'bf16' not in _plans('strict')[0]


def _plans(mode):
    return [plan.primitive.pd.implementation() for key, plan in
            onednn._plan._cache.items() if key[0] == 'conv'
            and plan is not None and mode in key]


def test_an_unknown_mode_is_one_clear_error():
    x = numpy.ones((1, 1, 3, 3), numpy.float32)
    with using_config('fp32_math', 'fast'):
        with pytest.raises(ValueError, match="fp32_math must be one of "
                           "'strict', 'bf16', 'tf32', got 'fast'"):
            F.convolution_2d(x, x)


_FALLBACK = '''
import warnings, numpy
import minichain
from minichain import functions as F
rng = numpy.random.default_rng(0)
x = rng.standard_normal((2, 16, 10, 10)).astype(numpy.float32)
W = rng.standard_normal((16, 16, 3, 3)).astype(numpy.float32)
with minichain.using_config('fp32_math', 'strict'):
    strict = F.convolution_2d(x, W, pad=1).array
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter('always')
    with minichain.using_config('fp32_math', 'bf16'):
        for _ in range(2):
            low = F.convolution_2d(x, W, pad=1).array
print(numpy.array_equal(strict, low))
for w in said:
    print(w.category.__name__ + ':', w.message)
'''


@pytest.mark.parametrize('env', [{'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE',
                                  'MINICHAIN_ONEDNN': 'auto'},
                                 {'MINICHAIN_ONEDNN': 'never'}],
                         ids=['no-bf16-instructions', 'no-onednn'])
def test_without_bf16_the_cpu_computes_float32_and_says_so_once(env):
    # ONEDNN_MAX_CPU_ISA caps what oneDNN dispatches to, as a CPU without
    # AVX512_BF16 (CI's may be one) would have it.
    done = subprocess.run([sys.executable, '-c', _FALLBACK],
                          env=dict(os.environ, **env), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == 'True'                # float32, bit for bit
    assert len(lines) == 2, lines            # one warning for two calls
    assert lines[1].startswith("RuntimeWarning: config.fp32_math is 'bf16' "
                               "but ")
    assert lines[1].endswith(': the CPU computes in float32 (said once)')
    why = ('no bfloat16 dot products' if 'ONEDNN_MAX_CPU_ISA' in env
           else "oneDNN is not in use (use_onednn is 'never')")
    assert why in lines[1]


def test_tf32_on_the_cpu_is_float32_and_said(monkeypatch):
    monkeypatch.setattr(fpmath, '_warned', False)
    x = numpy.ones((1, 2, 4, 4), numpy.float32)
    W = numpy.ones((2, 2, 3, 3), numpy.float32)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter('always')
        with using_config('fp32_math', 'tf32'):
            y = F.convolution_2d(x, W, pad=1).array
    assert [str(w.message) for w in said] == [
        "config.fp32_math is 'tf32' but TF32 is a GPU mode: the CPU "
        "computes in float32 (said once)"]
    assert y[0, 0, 1, 1] == 18.0


@pytest.mark.parametrize('n,i,o', [(32, 784, 100), (5, 7, 3)])
def test_bfloat16_arrays_take_the_linear_kernels_in_any_mode(n, i, o):
    # mixed16's activations on the CPU: the kernels read bfloat16 as it is
    # and round their float32 sums to bfloat16, as the bodies do: the two
    # differ by a float32 summation order and the bfloat16 roundings (the
    # body's linear rounds x W^T before adding b: of the products' size).
    ml_dtypes = pytest.importorskip('ml_dtypes')
    rng = numpy.random.default_rng(n)
    x, W, b, gy = (_rand(rng, s).astype(ml_dtypes.bfloat16)
                   for s in ((n, i), (o, i), o, (n, o)))
    for make, inputs, terms in ((LinearFunction, (x, W, b), i + 1),
                                (MatMul, (gy, W), o), (MatMul, (gy.T, x), n)):
        node = make()
        got = minichain.kernels.registered(make, 'onednn')(node, inputs)
        if got is None:   # oneDNN 3.2 has no bfloat16 code below AVX512
            assert not AVX512, make.__name__
            continue
        got, = got
        ref, = make().forward(inputs)
        assert got.dtype == ref.dtype == x.dtype
        wide = [a.astype(numpy.float64) for a in inputs]
        mag = make().forward(tuple(abs(a) for a in wide))[0]
        bound = (4 * U16 + 2 * terms * U32) * mag
        assert numpy.all(abs(got.astype(numpy.float64) - ref) <= bound)


@pytest.mark.usefixtures('every_size')
@pytest.mark.parametrize('spec', CONVS[::4] + [
    (4, 16, 2, 8, 3, 1, 1), (4, 16, 4, 8, 1, 2, 0), (4, 16, 4, 8, 1, 1, 0),
    (4, 8, 4, 16, 3, 2, 1)], ids=lambda s: 'n{}c{}h{}o{}k{}s{}p{}'.format(*s))
@pytest.mark.parametrize('layout', ['C', 'channels-last'])
def test_bfloat16_arrays_take_the_convolutions_in_any_mode(spec, layout):
    # mixed16's activations and cast weights on the CPU: read and written
    # in bfloat16 (small maps through the products too), float32 sums
    # inside: within one bfloat16 rounding of the float64 result plus the
    # sums' float32 error. A CPU without bfloat16 code may decline.
    ml_dtypes = pytest.importorskip('ml_dtypes')
    n, c, h, o, k, s, p = spec
    oh = (h + 2 * p - k) // s + 1
    rng = numpy.random.default_rng(sum(spec))

    def rand(shape):
        a = _rand(rng, shape).astype(ml_dtypes.bfloat16)
        if layout == 'C' or len(shape) != 4:
            return a
        return numpy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(
            0, 3, 1, 2)
    x, W, gy = rand((n, c, h, h)), rand((o, c, k, k)), rand((n, o, oh, oh))
    stride, pad = (s, s), (p, p)
    for make, inputs, terms in (
            (lambda: C.Convolution2D(stride, pad, False, (1, 1), 1), (x, W),
             c * k * k),
            (lambda: C.Deconvolution2D(stride, pad, (h, h), False, (1, 1), 1),
             (gy, W), o * k * k),
            (lambda: C.Convolution2DGradW(W.shape, stride, pad, False, (1, 1),
                                          1), (x, gy), n * oh * oh)):
        node = make()
        kernel = minichain.kernels.registered(type(node), 'onednn')
        with using_config('fp32_math', 'strict'):
            out = kernel.__wrapped__(node, inputs)
        if out is None:
            assert not AVX512, (type(node).__name__, layout)
            continue
        wide = tuple(a.astype(numpy.float64) for a in inputs)
        ref, = make().forward(wide)
        mag, = make().forward(tuple(abs(a) for a in wide))
        assert out[0].dtype == x.dtype and out[0].shape == ref.shape
        bound = (2 * U16 + 2 * terms * U32) * mag + 1e-30
        assert numpy.all(abs(out[0].astype(numpy.float64) - ref) <= bound), \
            type(node).__name__
