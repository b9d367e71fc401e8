import numpy
import pytest

import minichain
from minichain import backend, kernel_seam
from minichain import functions as F
from minichain.functions import normalization as N
from minichain.functions.activation import ReLUGrad
from minichain.functions.normalization import (
    _batch_normalization_composite, _fixed_batch_normalization_composite)
from minichain.gradient_check import check_backward, check_double_backward

SHAPES = [(5, 3), (4, 3, 2, 3)]
TOL64 = dict(eps=1e-6, atol=1e-7, rtol=1e-6)
TOL32 = dict(eps=1e-2, atol=1e-2, rtol=1e-2)


def _data(shape, dtype=numpy.float64, seed=0, offset=0.0):
    rng = numpy.random.default_rng(seed)
    c = shape[1]
    x = (rng.standard_normal(shape) * 1.5 + offset).astype(dtype)
    gamma = rng.uniform(0.5, 1.5, c).astype(dtype)
    beta = rng.standard_normal(c).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    return x, gamma, beta, gy


def _ref(x, gamma, beta, eps=2e-5):
    """Direct NumPy reference in float64 (channel axis 1)."""
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = [1] * x.ndim
    bshape[1] = -1
    x = x.astype(numpy.float64)
    mean = x.mean(axis=axes)
    var = x.var(axis=axes)
    y = ((x - mean.reshape(bshape)) / numpy.sqrt(var.reshape(bshape) + eps)
         * gamma.reshape(bshape) + beta.reshape(bshape))
    return y, mean, var


def _grads(func, arrays, gy):
    vs = [minichain.Variable(a.copy()) for a in arrays]
    y = func(*vs)
    y.grad = gy
    y.backward()
    return y.array, [v.grad for v in vs]


def _channel_major(a):
    """A copy of ``a`` in channel-major memory (``functions/_layout.py``)."""
    _layout = pytest.importorskip('minichain.kernels.numpy._layout')
    out = _layout.empty_channel_major(a.shape, a.dtype)
    out[...] = a
    return out


# -- forward ------------------------------------------------------------------
@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('dtype,tol', [(numpy.float64, 1e-12),
                                       (numpy.float32, 2e-5)])
def test_forward_matches_numpy(shape, dtype, tol):
    x, gamma, beta, _ = _data(shape, dtype)
    y = F.batch_normalization(x, gamma, beta)
    assert y.dtype == dtype and y.shape == shape
    numpy.testing.assert_allclose(y.array, _ref(x, gamma, beta)[0],
                                  atol=tol, rtol=tol)


@pytest.mark.parametrize('channel_major', [False, True])
def test_forward_large_mean_stays_accurate_in_float32(channel_major):
    # |mean| >> std: the one-pass variance would cancel; the two-pass
    # fallback must keep float32 accurate (forward and gradients), in the
    # NCHW path and in the channel blocks of a channel-major x.
    x, gamma, beta, gy = _data((4, 3, 5, 5), numpy.float32, offset=300.0)
    if channel_major:  # (_grads copies into C order: call it directly)
        xv = minichain.Variable(_channel_major(x))
        yv = F.batch_normalization(xv, gamma, beta)
        yv.grad = _channel_major(gy)
        yv.backward()
        y, grads = yv.array, [xv.grad]
    else:
        y, grads = _grads(F.batch_normalization, (x, gamma, beta), gy)
    y64, grads64 = _grads(F.batch_normalization,
                          [a.astype(numpy.float64) for a in (x, gamma, beta)],
                          gy.astype(numpy.float64))
    numpy.testing.assert_allclose(y, _ref(x, gamma, beta)[0], atol=2e-3)
    for g, g64 in zip(grads, grads64):
        numpy.testing.assert_allclose(g, g64, atol=2e-3, rtol=1e-3)


def test_running_statistics_updated_in_place():
    x, gamma, beta, _ = _data((6, 3, 2, 2))
    rm = numpy.full(3, 0.5)
    rv = numpy.full(3, 2.0)
    rm_id, rv_id = id(rm), id(rv)
    F.batch_normalization(x, gamma, beta, running_mean=rm, running_var=rv,
                          decay=0.7)
    _, mean, var = _ref(x, gamma, beta)
    m = 6 * 2 * 2
    numpy.testing.assert_allclose(rm, 0.7 * 0.5 + 0.3 * mean, rtol=1e-12)
    numpy.testing.assert_allclose(rv, 0.7 * 2.0 + 0.3 * var * m / (m - 1),
                                  rtol=1e-12)
    assert (id(rm), id(rv)) == (rm_id, rv_id)


def test_axis_argument_and_multi_axis_gamma():
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5))
    gamma, beta = rng.uniform(0.5, 1.5, 5), rng.standard_normal(5)
    y = F.batch_normalization(x, gamma, beta, axis=(0, 1)).array
    mean, var = x.mean(axis=(0, 1)), x.var(axis=(0, 1))
    numpy.testing.assert_allclose(
        y, (x - mean) / numpy.sqrt(var + 2e-5) * gamma + beta, atol=1e-12)
    # gamma of shape (4, 5): default axes are (0,) (channels are 1 and 2)
    g2, b2 = rng.uniform(0.5, 1.5, (4, 5)), rng.standard_normal((4, 5))
    y = F.batch_normalization(x, g2, b2).array
    mean, var = x.mean(axis=0), x.var(axis=0)
    numpy.testing.assert_allclose(
        y, (x - mean) / numpy.sqrt(var + 2e-5) * g2 + b2, atol=1e-12)


def test_no_graph_in_no_backprop_mode():
    x, gamma, beta, _ = _data((4, 3))
    with minichain.no_backprop_mode():
        y = F.batch_normalization(minichain.Variable(x), gamma, beta)
    assert y.creator is None


# -- gradients ----------------------------------------------------------------
@pytest.mark.parametrize('shape', SHAPES)
def test_backward_float64(shape):
    x, gamma, beta, gy = _data(shape)
    check_backward(F.batch_normalization, (x, gamma, beta), gy, **TOL64)


@pytest.mark.parametrize('shape', SHAPES)
def test_backward_float32(shape):
    x, gamma, beta, gy = _data(shape, numpy.float32)
    check_backward(F.batch_normalization, (x, gamma, beta), gy, **TOL32)


@pytest.mark.parametrize('shape', SHAPES)
def test_composite_backward_float64(shape):
    x, gamma, beta, gy = _data(shape)
    check_backward(_batch_normalization_composite, (x, gamma, beta), gy,
                   **TOL64)


@pytest.mark.parametrize('shape,axis,offset', [
    ((5, 3), None, 0.0), ((4, 3, 2, 3), None, 0.0),
    ((4, 3, 2, 3), None, 50.0),        # two-pass (centered) statistics
    ((3, 4, 5), (0, 2), 0.0),
    ((2, 3, 4, 5), (0, 2), 0.0),       # channel axes 1, 3: generic path
])
def test_fused_equals_composite(shape, axis, offset):
    x, _, _, gy = _data(shape, seed=3, offset=offset)
    cshape = tuple(s for i, s in enumerate(shape)
                   if i not in (axis or (0,) + tuple(range(2, len(shape)))))
    rng = numpy.random.default_rng(13)
    gamma, beta = rng.uniform(0.5, 1.5, cshape), rng.standard_normal(cshape)
    y1, g1 = _grads(lambda *a: F.batch_normalization(*a, axis=axis),
                    (x, gamma, beta), gy)
    y2, g2 = _grads(lambda *a: _batch_normalization_composite(*a, axis=axis),
                    (x, gamma, beta), gy)
    numpy.testing.assert_allclose(y1, y2, atol=1e-12)
    for a, b in zip(g1, g2):
        numpy.testing.assert_allclose(a, b, atol=1e-10)


def test_non_contiguous_input():
    x, gamma, beta, gy = _data((3, 2, 4, 5), seed=14)
    xt = x.transpose(0, 1, 3, 2)  # a view, not C-contiguous
    y1 = F.batch_normalization(xt, gamma, beta).array
    y2 = F.batch_normalization(numpy.ascontiguousarray(xt), gamma, beta).array
    numpy.testing.assert_allclose(y1, y2, atol=1e-12)


def test_fused_equals_composite_with_broadcast_gradient():
    # backward of F.sum hands a broadcast (non-contiguous) gradient.
    x, gamma, beta, _ = _data((4, 3, 2, 2), seed=4)
    w = numpy.random.default_rng(5).standard_normal(x.shape)
    grads = []
    for f in (F.batch_normalization, _batch_normalization_composite):
        vs = [minichain.Variable(a.copy()) for a in (x, gamma, beta)]
        F.sum(f(*vs) * w).backward()
        grads.append([v.grad for v in vs])
    for a, b in zip(*grads):
        numpy.testing.assert_allclose(a, b, atol=1e-11)


@pytest.mark.parametrize('shape', SHAPES)
def test_double_backward_float64(shape):
    x, gamma, beta, gy = _data(shape, seed=6)
    rng = numpy.random.default_rng(7)
    ggs = (rng.standard_normal(shape), rng.standard_normal(3),
           rng.standard_normal(3))
    check_double_backward(F.batch_normalization, (x, gamma, beta), gy, ggs,
                          eps=1e-6, atol=1e-6, rtol=1e-5)


def test_double_backward_fused_equals_composite():
    x, gamma, beta, gy = _data((4, 3, 2), seed=8)
    w = numpy.random.default_rng(9).standard_normal(x.shape)
    results = []
    for f in (F.batch_normalization, _batch_normalization_composite):
        vs = [minichain.Variable(a.copy()) for a in (x, gamma, beta)]
        y = f(*vs)
        y.grad = gy
        y.backward(enable_double_backprop=True)
        gx = vs[0].grad_var
        for v in vs:
            v.cleargrad()
        F.sum(gx * w).backward()
        results.append([v.grad for v in vs])
    assert results[0][2] is None and results[1][2] is None  # beta: linear
    for a, b in zip(results[0][:2], results[1][:2]):
        numpy.testing.assert_allclose(a, b, atol=1e-10)


# -- the ResNet block's end: residual and relu --------------------------------
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32,
                                   numpy.float64])
@pytest.mark.parametrize('layout', ['nchw', 'channel_major', 'mixed'])
@pytest.mark.parametrize('with_residual,relu', [(False, True), (True, False),
                                                (True, True)])
def test_residual_and_relu_equal_the_separate_ops(dtype, layout,
                                                  with_residual, relu):
    """The fused end (in cache, by blocks of channels where both arrays are
    channel-major) gives the bits of bn, then +, then relu."""
    x, gamma, beta, gy = _data((4, 6, 5, 5), dtype, seed=21)
    r = numpy.random.default_rng(22).standard_normal(x.shape).astype(dtype)
    if layout != 'nchw':
        x = _channel_major(x)
    if layout == 'channel_major':
        r = _channel_major(r)
    r = r if with_residual else None
    y = F.batch_normalization(x, gamma, beta, residual=r, relu=relu)
    want = F.batch_normalization(x, gamma, beta)
    if r is not None:
        want = want + r
    if relu:
        want = F.relu(want)
    assert y.dtype == dtype
    assert numpy.array_equal(y.array, want.array)


@pytest.mark.parametrize('with_residual', [True, False])
def test_residual_and_relu_gradients_float64(with_residual):
    """Without a residual, relu's backward runs inside
    BatchNormalizationGrad (given y): first and second order too."""
    x, gamma, beta, gy = _data((3, 4, 3, 3), seed=23)
    rng = numpy.random.default_rng(24)
    inputs = (x, gamma, beta) + ((rng.standard_normal(x.shape),)
                                 if with_residual else ())
    ggs = [rng.standard_normal(a.shape) for a in inputs]

    def fused(x, g, b, r=None):
        return F.batch_normalization(x, g, b, residual=r, relu=True)

    def composite(x, g, b, r=None):
        return _batch_normalization_composite(x, g, b, residual=r, relu=True)
    check_backward(fused, inputs, gy, **TOL64)
    check_backward(composite, inputs, gy, **TOL64)
    check_double_backward(fused, inputs, gy, ggs,
                          eps=1e-6, atol=1e-6, rtol=1e-5)
    _, g1 = _grads(fused, inputs, gy)
    _, g2 = _grads(composite, inputs, gy)
    for a, b in zip(g1, g2):
        numpy.testing.assert_allclose(a, b, atol=1e-10)
    if with_residual:
        # relu's mask holds back the gradient where the output is zero
        y, (_, _, _, gr) = _grads(fused, inputs, gy)
        assert (y == 0).any() and (gr[y == 0] == 0).all()
        assert numpy.array_equal(gr[y > 0], gy[y > 0])


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32,
                                   numpy.float64])
def test_grad_given_y_equals_relu_grad_then_grad(dtype):
    """BatchNormalizationGrad given y: the bits of ReLUGrad, then
    BatchNormalizationGrad on the masked gy (the bodies)."""
    x, gamma, beta, gy = _data((4, 5, 3, 3), dtype, seed=25)
    with minichain.using_config('use_kernels', False):
        y = F.batch_normalization(minichain.Variable(x), gamma, beta,
                                  relu=True)
    bn = y.creator

    def grad():
        return N.BatchNormalizationGrad(bn.lay, bn.eps, bn.mean, bn.inv_std,
                                        bn.centered)
    node = grad()
    got = node.forward((x, gamma, gy, y.array))
    masked, = ReLUGrad().forward((y.array, gy))
    want = grad().forward((x, gamma, masked))
    assert (y.array == 0).any() and (y.array > 0).any()
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and numpy.array_equal(a, b)
    assert node._input_indexes_to_retain == (0, 1, 2, 3)


@pytest.mark.parametrize('with_residual', [False, True])
def test_relu_backward_is_a_node_of_its_own_only_with_a_residual(
        with_residual):
    x, gamma, beta, gy = _data((4, 3, 2, 2), seed=26)
    r = numpy.ones_like(x) if with_residual else None
    y = F.batch_normalization(minichain.Variable(x), gamma, beta,
                              residual=r, relu=True)
    applied = []
    real = kernel_seam.forward

    def spy(node, inputs):
        applied.append((type(node), len(inputs)))
        return real(node, inputs)
    kernel_seam.forward = spy  # the seam FunctionNode.apply calls
    try:
        y.grad = gy
        y.backward()
    finally:
        kernel_seam.forward = real
    if with_residual:
        assert applied == [(ReLUGrad, 2), (N.BatchNormalizationGrad, 3)]
    else:
        assert applied == [(N.BatchNormalizationGrad, 4)]


@pytest.mark.parametrize('offset', [0.0, 3.0, 50.0])
@pytest.mark.parametrize('dtype,tol', [(numpy.float64, 1e-11),
                                       (numpy.float32, 2e-5)])
def test_channel_blocks_equal_the_nchw_path(offset, dtype, tol):
    """Channel-major x and gy go through the channel blocks (one-pass
    statistics and an uncentered backward at offsets 0 and 3, both
    centered at 50); NCHW copies go the other way: the same results."""
    x, gamma, beta, gy = _data((4, 5, 3, 3), dtype, seed=27, offset=offset)
    results = []
    for to in (numpy.ascontiguousarray, _channel_major):
        xv = minichain.Variable(to(x))
        y = F.batch_normalization(xv, gamma, beta)
        y.grad = to(gy)
        y.backward()
        results.append((y.array, xv.grad))
    for a, b in zip(*results):
        numpy.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_residual_errors_name_function_and_shapes():
    x, gamma, beta, _ = _data((4, 3, 2, 2), numpy.float32)
    with pytest.raises(ValueError, match=r'batch_normalization: residual '
                       r'has shape \(4, 3, 2\) but x has shape '
                       r'\(4, 3, 2, 2\)'):
        F.batch_normalization(x, gamma, beta, residual=x[..., 0])
    with pytest.raises(TypeError, match='batch_normalization: .*float64'):
        F.batch_normalization(x, gamma, beta,
                              residual=x.astype(numpy.float64))


# -- fixed (inference) --------------------------------------------------------
def _fixed_data(shape, dtype=numpy.float64):
    x, gamma, beta, gy = _data(shape, dtype, seed=10)
    rng = numpy.random.default_rng(11)
    mean = rng.standard_normal(shape[1]).astype(dtype)
    var = rng.uniform(0.5, 2.0, shape[1]).astype(dtype)
    return (x, gamma, beta, mean, var), gy


@pytest.mark.parametrize('shape', SHAPES)
def test_fixed_forward_matches_numpy(shape):
    (x, gamma, beta, mean, var), _ = _fixed_data(shape)
    bshape = (1, -1) + (1,) * (len(shape) - 2)
    ref = ((x - mean.reshape(bshape)) / numpy.sqrt(var.reshape(bshape) + 1e-3)
           * gamma.reshape(bshape) + beta.reshape(bshape))
    y = F.fixed_batch_normalization(x, gamma, beta, mean, var, eps=1e-3)
    numpy.testing.assert_allclose(y.array, ref, atol=1e-12)


@pytest.mark.parametrize('shape', SHAPES)
def test_fixed_backward_all_inputs(shape):
    inputs, gy = _fixed_data(shape)
    check_backward(F.fixed_batch_normalization, inputs, gy, **TOL64)
    check_backward(_fixed_batch_normalization_composite, inputs, gy, **TOL64)
    inputs32 = tuple(a.astype(numpy.float32) for a in inputs)
    check_backward(F.fixed_batch_normalization, inputs32,
                   gy.astype(numpy.float32), **TOL32)


def test_fixed_fused_equals_composite_and_double_backward():
    inputs, gy = _fixed_data((4, 3, 2))
    y1, g1 = _grads(F.fixed_batch_normalization, inputs, gy)
    y2, g2 = _grads(_fixed_batch_normalization_composite, inputs, gy)
    numpy.testing.assert_allclose(y1, y2, atol=1e-12)
    for a, b in zip(g1, g2):
        numpy.testing.assert_allclose(a, b, atol=1e-11)
    rng = numpy.random.default_rng(12)
    ggs = tuple(rng.standard_normal(a.shape) for a in inputs)
    check_double_backward(F.fixed_batch_normalization, inputs, gy, ggs,
                          eps=1e-6, atol=1e-6, rtol=1e-5)


def test_fixed_differs_from_training_mode():
    x, gamma, beta, _ = _data((4, 3))
    y_train = F.batch_normalization(x, gamma, beta).array
    y_fixed = F.fixed_batch_normalization(x, gamma, beta, numpy.zeros(3),
                                          numpy.ones(3)).array
    assert not numpy.allclose(y_train, y_fixed)


# -- errors -------------------------------------------------------------------
def test_errors_name_function_and_shapes():
    x = numpy.zeros((4, 3, 2, 2), numpy.float32)
    g3 = numpy.ones(3, numpy.float32)
    g4 = numpy.ones(4, numpy.float32)
    with pytest.raises(ValueError, match=r'batch_normalization: gamma has '
                       r'shape \(4,\).*\(4, 3, 2, 2\).*\(3,\)'):
        F.batch_normalization(x, g4, g3)
    with pytest.raises(ValueError, match=r'beta has shape \(4,\)'):
        F.batch_normalization(x, g3, g4)
    with pytest.raises(ValueError, match=r'at least 2 axes.*\(3,\)'):
        F.batch_normalization(g3, g3, g3)
    with pytest.raises(TypeError, match='batch_normalization: .*float64'):
        F.batch_normalization(x, g3.astype(numpy.float64), g3)
    with pytest.raises(TypeError, match='floating point'):
        F.batch_normalization(x.astype(numpy.int32), g3, g3)
    with pytest.raises(ValueError, match=r'\(1, 3\) has 1 element.*at least'):
        F.batch_normalization(numpy.zeros((1, 3), numpy.float32), g3, g3)
    with pytest.raises(ValueError, match=r'running_var has shape \(4,\)'):
        F.batch_normalization(x, g3, g3, running_var=g4)
    with pytest.raises(ValueError, match='reduces every axis'):
        F.batch_normalization(x, g3, g3, axis=(0, 1, 2, 3))
    with pytest.raises(ValueError, match=r'fixed_batch_normalization: var '
                       r'has shape \(4,\)'):
        F.fixed_batch_normalization(x, g3, g3, g3, g4)


def test_one_sample_is_fine_in_fixed_mode():
    x = numpy.ones((1, 3), numpy.float32)
    g = numpy.ones(3, numpy.float32)
    y = F.fixed_batch_normalization(x, g, g * 0, g * 0, g)
    numpy.testing.assert_allclose(y.array, 1 / numpy.sqrt(1 + 2e-5),
                                  rtol=1e-6)


# -- float16 ------------------------------------------------------------------
_ON = [pytest.param(lambda a: a, id='cpu'),
       pytest.param(backend.to_gpu, id='gpu', marks=[
           pytest.mark.gpu, pytest.mark.skipif(not backend.gpu_available(),
                                               reason='no CUDA GPU')])]


@pytest.mark.parametrize('to', _ON)
def test_float16_statistics_are_float32(to):
    """A channel of 64*56*56 values in [0.5, 1.5) sums to ~2e5, past
    float16's 65504: the sums and statistics must not be half precision
    (they were: all NaN). Checked against float64, forward and backward,
    and the running statistics."""
    rng = numpy.random.default_rng(3)
    shape = (64, 2, 56, 56)
    x = rng.uniform(0.5, 1.5, shape).astype(numpy.float16)
    gamma = numpy.array([0.5, 2.0], numpy.float16)
    beta = numpy.array([0.25, -1.0], numpy.float16)
    gy = rng.standard_normal(shape).astype(numpy.float16)
    want = _grads(F.batch_normalization, [a.astype(numpy.float64) for a in
                                          (x, gamma, beta)],
                  gy.astype(numpy.float64))
    rm = to(numpy.zeros(2, numpy.float16))
    rv = to(numpy.ones(2, numpy.float16))
    got = _grads(lambda *a: F.batch_normalization(
        *a, running_mean=rm, running_var=rv, decay=0.0),
        [to(a) for a in (x, gamma, beta)], to(gy))
    got = [backend.to_cpu(got[0])] + [backend.to_cpu(g) for g in got[1]]
    assert all(g.dtype == numpy.float16 for g in got)
    assert all(numpy.isfinite(g).all() for g in got)
    for g, w, tol in zip(got, [want[0]] + want[1], (4e-3, 2e-2, 1e-2, 1e-2)):
        scale = numpy.abs(w).max()
        numpy.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale)
    x64 = x.astype(numpy.float64)
    numpy.testing.assert_allclose(backend.to_cpu(rm),
                                  x64.mean(axis=(0, 2, 3)), rtol=1e-3)
    numpy.testing.assert_allclose(backend.to_cpu(rv),
                                  x64.var(axis=(0, 2, 3), ddof=1),
                                  rtol=2e-3)


# -- GPU ----------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float64])
def test_gpu_matches_cpu(dtype):
    x, gamma, beta, gy = _data((4, 3, 5, 5), dtype, offset=2.0)
    rm, rv = numpy.zeros(3, dtype), numpy.ones(3, dtype)
    cpu = _grads(lambda *a: F.batch_normalization(
        *a, running_mean=rm, running_var=rv), (x, gamma, beta), gy)
    rm_g, rv_g = backend.to_gpu(numpy.zeros(3, dtype)), backend.to_gpu(
        numpy.ones(3, dtype))
    gpu = _grads(lambda *a: F.batch_normalization(
        *a, running_mean=rm_g, running_var=rv_g),
        backend.to_gpu([x, gamma, beta]), backend.to_gpu(gy))
    tol = 1e-4 if dtype == numpy.float32 else 1e-10
    for a, b in zip([cpu[0]] + cpu[1] + [rm, rv],
                    [gpu[0]] + gpu[1] + [rm_g, rv_g]):
        numpy.testing.assert_allclose(a, backend.to_cpu(b), atol=tol,
                                      rtol=tol)
    inputs, gy = _fixed_data((4, 3, 5), dtype)
    cpu = _grads(F.fixed_batch_normalization, inputs, gy)
    gpu = _grads(F.fixed_batch_normalization, backend.to_gpu(list(inputs)),
                 backend.to_gpu(gy))
    for a, b in zip([cpu[0]] + cpu[1], [gpu[0]] + gpu[1]):
        numpy.testing.assert_allclose(a, backend.to_cpu(b), atol=tol,
                                      rtol=tol)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_gpu_residual_and_relu_match_cpu():
    x, gamma, beta, gy = _data((4, 3, 5, 5), numpy.float32, seed=25)
    r = numpy.random.default_rng(26).standard_normal(x.shape).astype(
        numpy.float32)

    def f(*a):
        return F.batch_normalization(*a[:3], residual=a[3], relu=True)
    cpu = _grads(f, (x, gamma, beta, r), gy)
    gpu = _grads(f, backend.to_gpu([x, gamma, beta, r]), backend.to_gpu(gy))
    for a, b in zip([cpu[0]] + cpu[1], [gpu[0]] + gpu[1]):
        numpy.testing.assert_allclose(a, backend.to_cpu(b), atol=1e-4,
                                      rtol=1e-4)
