"""Every registered NumPy kernel equals its op's body at ResNet-50's shapes.

A ResNet-50 training step (forward, loss, backward) and an inference
forward run with the kernels on, and every node that has a NumPy kernel is
recorded, unapplied, with copies of its inputs (in the layouts the step
really gave it: the convolutions' outputs are channel-major), once per
distinct (type, shapes, layouts, hyper-parameters). Each recorded case
then runs the kernel and the body (``minichain.kernels.testing``) and
compares outputs, retained indexes, the node's attributes and the running
statistics, within float32 tolerances derived from each op's sums
(:func:`_tolerances`). At the main job's shape (28 px, the small2 stem)
every case also runs again on C-contiguous copies, the other route of
most kernels. Ops that ResNet-50 does not use (average pooling, MatMul,
the max-pooling gather of double backprop) get cases of their own.
(MomentumSGD's oneDNN update: tests/kernels/test_onednn_update.py.)
"""
import copy

import numpy
import pytest

import minichain
from minichain import functions as F
from minichain import kernel_seam, kernels
from minichain.functions import geometry
from minichain.functions import pooling as P
from minichain.functions.basic_math import MatMul
from minichain.kernels import testing
from minichain.kernels.numpy import _layout
from models.resnet import ResNet50

EPS = float(numpy.finfo(numpy.float32).eps)


def _amax(a):
    return float(numpy.abs(a).max()) if a is not None and a.size else 0.0


def _layout_of(a):
    if a.flags.c_contiguous:
        return 'C'
    return 'CM' if _layout.channel_major(a) is not None else 'other'


def _hyper(node):
    """The node's hyper-parameters, as a key (arrays by shape only)."""
    out = []
    for k, v in sorted(vars(node).items()):
        if isinstance(v, numpy.ndarray):
            v = ('array', v.shape, v.dtype.str)
        elif hasattr(v, '__dict__') and not callable(v):
            v = repr(sorted(vars(v).items()))
        out.append((k, repr(v)))
    return tuple(out)


def record_step(size, stem, batch, in_channels, seed=0):
    """{key: (unapplied node, input copies)} of a ResNet-50 step's nodes
    that have a NumPy kernel, plus those of an inference forward."""
    rng = numpy.random.default_rng(seed)
    model = ResNet50(n_classes=10, stem=stem, in_channels=in_channels)
    x = rng.standard_normal((batch, in_channels, size, size)).astype(
        numpy.float32)
    t = rng.integers(0, 10, batch).astype(numpy.int32)
    samples = {}
    real = kernel_seam.forward

    def record(node, inputs):
        if kernels.registered(type(node), 'numpy') is not None:
            key = (type(node).__name__,
                   tuple((a.shape, _layout_of(a)) for a in inputs),
                   _hyper(node))
            if key not in samples:
                samples[key] = (copy.deepcopy(node),
                                tuple(testing._copy(a) for a in inputs))
        return real(node, inputs)
    kernel_seam.forward = record  # the seam FunctionNode.apply calls
    try:
        loss = F.softmax_cross_entropy(model(x), t)
        model.cleargrads()
        loss.backward()
        with minichain.using_config('train', False):
            model(x)
    finally:
        kernel_seam.forward = real
    return samples


# -- tolerances from each op's arithmetic ------------------------------------
def _bn_forward(node, inputs):
    x, gamma = inputs[0], inputs[1]
    body = copy.deepcopy(node)
    y, = body.forward(tuple(testing._copy(a) for a in inputs))
    m = node.lay.m
    mean, inv_std = body.mean, body.inv_std
    x_hat = _amax((x - mean.reshape(node.lay.bshape))
                  * inv_std.reshape(node.lay.bshape))
    # The kernel's one-pass variance amplifies its rounding at most 16x
    # (E[x^2] <= 16 var, else it centers first); the mean's error reaches
    # y through inv_std.
    unit = testing.sum_tolerance(m, 1.0, numpy.float32)
    y_tol = (unit * _amax(gamma) * (16 * x_hat + _amax(x) * _amax(inv_std))
             + 4 * EPS * (_amax(y) + _amax(inputs[3] if len(inputs) == 4
                                           else None)))
    return y_tol, {'mean': unit * _amax(x),
                   'inv_std': unit * 16 * _amax(inv_std),
                   'running_mean': unit * _amax(x),
                   'running_var': unit * 16 * _amax(x) ** 2}


def _bn_backward(node, inputs):
    x, gamma, gy = node.masked(inputs)  # with y: gy as the sums see it
    m, lay = node.lay.m, node.lay
    inv_std, mean = node.inv_std, node.mean
    x_hat = _amax((x - mean.reshape(lay.bshape)) * inv_std.reshape(lay.bshape))
    gbeta = testing.sum_tolerance(m, _amax(gy), numpy.float32)
    # Uncentered: inv_std * (sum(gy * x) - mean * sum(gy)).
    ggamma = _amax(inv_std) * (testing.sum_tolerance(
        m, _amax(gy) * _amax(x), numpy.float32) + _amax(mean) * gbeta)
    _, gg_b, gb_b = copy.deepcopy(node).forward(
        tuple(testing._copy(a) for a in inputs))
    a, q = _amax(gamma * inv_std), _amax(inv_std * gg_b) / m
    terms = _amax(gy) + x_hat * _amax(gg_b) / m + _amax(gb_b) / m
    gx = a * (x_hat * ggamma / m + gbeta / m + 8 * EPS * terms
              + 8 * EPS * q * (_amax(x) + _amax(mean)))
    return (gx, ggamma, gbeta), {}


def _tolerances(node, inputs):
    """(atol of each output, {attribute: atol}) for float32 inputs."""
    name = type(node).__name__
    s = testing.sum_tolerance
    f32 = numpy.float32
    if name in ('ReLU', 'ReLUGrad', 'MaxPooling2D', 'MaxPooling2DGather',
                'Add'):
        return 0.0, {}  # no sums (Add: one rounding): the same bits
    if name == 'Cast':
        # one rounding, but oneDNN's bfloat16 conversion (AVX512_BF16's
        # vcvtneps2bf16) reads float32 denormals as zero: within the
        # smallest normal float32
        return float(numpy.finfo(numpy.float32).tiny), {}
    if name == 'LinearFunction':
        x, W = inputs[:2]
        bias = _amax(inputs[2]) if len(inputs) == 3 else 0.0
        return s(x.shape[1], _amax(x) * _amax(W), f32) + 2 * EPS * bias, {}
    if name == 'MatMul':
        a, b = inputs
        return s(a.shape[-1], _amax(a) * _amax(b), f32), {}
    if name == 'Convolution2D':
        x, W = inputs[:2]
        k = W.shape[1] * W.shape[2] * W.shape[3]
        bias = _amax(inputs[2]) if len(inputs) == 3 else 0.0
        return s(k, _amax(x) * _amax(W), f32) + 2 * EPS * bias, {}
    if name == 'Deconvolution2D':
        x, W = inputs[:2]
        k = x.shape[1] // node.groups * W.shape[2] * W.shape[3]
        bias = _amax(inputs[2]) if len(inputs) == 3 else 0.0
        return s(k, _amax(x) * _amax(W), f32) + 2 * EPS * bias, {}
    if name == 'Convolution2DGradW':
        x, gy = inputs
        k = gy.shape[0] * gy.shape[2] * gy.shape[3]
        return s(k, _amax(x) * _amax(gy), f32), {}
    if name == 'GlobalAveragePooling2D':
        x, = inputs
        return s(x.shape[2] * x.shape[3], _amax(x), f32), {}
    if name in ('AveragePooling2D', 'AveragePooling2DGrad',
                'MaxPooling2DGrad'):
        g = node.g
        return s(g.kh * g.kw, _amax(inputs[0]), f32), {}
    if name == 'BatchNormalization':
        return _bn_forward(node, inputs)
    if name == 'BatchNormalizationGrad':
        return _bn_backward(node, inputs)
    if name == 'FixedBatchNormalization':
        x, gamma, beta, mean, var = inputs
        scale = _amax(gamma / numpy.sqrt(var + node.eps))
        return 8 * EPS * ((_amax(x) + _amax(mean)) * scale + _amax(beta)), {}
    raise KeyError('no tolerance for ' + name)


def check_case(node, inputs):
    kernel = kernels.registered(type(node), 'numpy')
    atol, attr_atol = _tolerances(node, inputs)
    testing.assert_kernel_equals_body(kernel, node, inputs, atol=atol,
                                      attr_atol=attr_atol,
                                      hints=('centered',))


def _contiguous(inputs):
    return tuple(numpy.ascontiguousarray(a) for a in inputs)


_STEPS = {'28:small2': (28, 'small2', 2, 1),  # the main job (Fashion-MNIST)
          '224:imagenet': (224, 'imagenet', 2, 3)}
_recorded = {}


def _cases(config):
    if config not in _recorded:
        _recorded[config] = record_step(*_STEPS[config])
    return _recorded[config]


def test_the_step_meets_every_kernel_of_resnet50():
    """The recording sees what it should: each kernel ResNet-50 uses, at
    the 16 convolution configurations of its small2 network."""
    cases = _cases('28:small2')
    types = {key[0] for key in cases}
    assert types == {'LinearFunction', 'MatMul',
                     'Convolution2D', 'Deconvolution2D',
                     'Convolution2DGradW', 'BatchNormalization',
                     'BatchNormalizationGrad', 'FixedBatchNormalization'}
    convs = {(key[1][1][0], key[1][0][0][2:]) for key in cases
             if key[0] == 'Convolution2D'}
    assert len(convs) >= 16, sorted(convs)


@pytest.mark.parametrize('contiguous', [False, True],
                         ids=['as-in-the-step', 'c-contiguous'])
def test_kernels_equal_bodies_at_the_main_jobs_shapes(contiguous):
    cases = _cases('28:small2')
    for node, inputs in cases.values():
        check_case(node, _contiguous(inputs) if contiguous else inputs)


@pytest.mark.slow
def test_kernels_equal_bodies_at_224():
    cases = _cases('224:imagenet')
    assert {'MaxPooling2D', 'MaxPooling2DGrad'} <= {k[0] for k in cases}
    for node, inputs in cases.values():
        check_case(node, inputs)
    _recorded.pop('224:imagenet')  # a few hundred MB of copies


def _pool_geometry(x, k, s, p, cover_all):
    return P._pool_geometry('test', x, k, s, p, cover_all)


@pytest.mark.parametrize('k,s,p,cover_all', [
    (3, 2, 1, False), (3, 2, 1, True), (2, 2, 0, False), (3, 1, 1, False)])
@pytest.mark.parametrize('layout', ['C', 'CM'])
def test_pooling_kernels_equal_bodies(k, s, p, cover_all, layout):
    """Pooling outside ResNet-50's one max pooling: average pooling, the
    gather of double backprop, both layouts, windows that overlap."""
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((2, 64, 14, 14)).astype(numpy.float32)
    if layout == 'CM':
        x = numpy.ascontiguousarray(x.swapaxes(0, 1)).swapaxes(0, 1)
    g = _pool_geometry(x, k, s, p, cover_all)
    check_case(P.MaxPooling2D(g), (x,))
    check_case(P.AveragePooling2D(g), (x,))
    gy = rng.standard_normal(x.shape[:2] + (g.oh, g.ow)).astype(x.dtype)
    check_case(P.AveragePooling2DGrad(g), (gy,))
    fwd = P.MaxPooling2D(g)
    fwd.forward((x,))  # the body's indexes (int32)...
    check_case(P.MaxPooling2DGrad(g, fwd.indexes), (gy,))
    check_case(P.MaxPooling2DGather(g, fwd.indexes), (x,))
    kern = P.MaxPooling2D(g)
    kernels.registered(P.MaxPooling2D, 'numpy')(kern, (x,))
    check_case(P.MaxPooling2DGrad(g, kern.indexes), (gy,))  # ...the kernel's


def test_matmul_kernel_equals_body():
    rng = numpy.random.default_rng(2)
    for a_shape, b_shape in (((32, 2048), (2048, 10)), ((3, 5, 64), (64, 7)),
                             ((64,), (64, 9))):
        check_case(MatMul(), (rng.standard_normal(a_shape).astype('f4'),
                              rng.standard_normal(b_shape).astype('f4')))


def test_the_switch_turns_the_kernels_off(monkeypatch):
    """config.use_kernels=False runs the body (the kernel is never called),
    and so does MINICHAIN_KERNELS=0 in a fresh process's default."""
    calls = []
    real = kernels.registered(F.basic_math.MatMul, 'numpy')

    def spy(node, inputs):
        calls.append(1)
        return real(node, inputs)
    monkeypatch.setitem(kernels.registry, (F.basic_math.MatMul, 'numpy'),
                        spy)
    x = numpy.ones((2, 3), numpy.float64)  # no oneDNN kernel for MatMul
    F.matmul(x, x.T)
    assert calls == [1]
    with minichain.using_config('use_kernels', False):
        F.matmul(x, x.T)
    assert calls == [1]


def test_geometry_window_reads_the_pixels_of_the_formula():
    """The bodies' window(): output (i, j) at offset (ky, kx) reads input
    pixel (i*sy + ky*dy - ph, j*sx + kx*dx - pw)."""
    x = numpy.arange(2 * 7 * 6, dtype=numpy.float32).reshape(1, 2, 7, 6)
    g = geometry.Geometry(3, 2, 2, 1, 1, 0, 2, 1, 7, 6, 3, 5)
    win = geometry.window(geometry.padded(x, g, -1), g, 2, 1)
    for i in range(g.oh):
        for j in range(g.ow):
            r, c = i * 2 + 2 * 2 - 1, j * 1 + 1 * 1 - 0
            want = x[0, 1, r, c] if 0 <= r < 7 and 0 <= c < 6 else -1
            assert win[0, 1, i, j] == want
