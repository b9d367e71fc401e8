"""The oneDNN kernels of ReLU, pooling and linear
(minichain/kernels/onednn/activation.py, pooling.py, linear.py) against
their ops' bodies at every ResNet-50 shape they serve (batch 2), with
tolerances from the arithmetic: 0 where nothing is summed (ReLU, max
pooling's forward and its indexes), ``testing.sum_tolerance`` of the
number of terms a value sums otherwise. Registered or not (the
measurements in onednn/__init__.py decide), each is tested here; what
they decline falls back to the NumPy kernels through the seam."""
import math

import numpy
import pytest

from minichain import kernels, using_config
from minichain.functions import activation as A
from minichain.functions import basic_math as M
from minichain.functions import pooling as P
from minichain.functions.linear import LinearFunction
from minichain.kernels import testing
from tests.kernels.test_onednn import BNS, onednn

F32 = numpy.float32
U = float(numpy.finfo(F32).eps) / 2   # float32's unit roundoff


@pytest.fixture(autouse=True)
def onednn_on():
    with using_config('use_onednn', 'auto'):
        yield


def _kernel(node_type):
    """The oneDNN kernel of node_type, registered or only written."""
    kernel = kernels.registered(node_type, 'onednn')
    if kernel is not None:
        return getattr(kernel, '__wrapped__', kernel)
    return dict(onednn.UNREGISTERED)[node_type]


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


def _sum_tol(terms, magnitude):
    return testing.sum_tolerance(terms, magnitude, F32)


# -- ReLU ---------------------------------------------------------------------
def _channels_last(a):
    """``a``'s values in an (N, C, H, W) array over NHWC memory."""
    return numpy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(
        0, 3, 1, 2)


def _channel_major(a):
    """``a``'s values over (C, N, H, W) memory (the NumPy kernels')."""
    return numpy.ascontiguousarray(a.swapaxes(0, 1)).swapaxes(0, 1)


_LAYOUTS = {'nchw': lambda a: a, 'nhwc': _channels_last,
            'cnhw': _channel_major}


@pytest.mark.parametrize('spec', BNS, ids=lambda s: 'n{}c{}h{}'.format(*s))
@pytest.mark.parametrize('layout', ['nchw', 'nhwc', 'cnhw'])
def test_relu_kernels_equal_bodies_bit_for_bit(spec, layout, monkeypatch):
    # every size, also those left to the NumPy kernel for speed; C-ordered
    # arrays, the channels-last ones of the oneDNN kernels and the
    # channel-major ones of the NumPy kernels
    monkeypatch.setattr(onednn.activation, '_MIN_SIZE', 1)
    n, c, h = spec
    rng = numpy.random.default_rng(sum(spec))
    lay = _LAYOUTS[layout]
    x = lay(_rand(rng, n, c, h, h))
    (y,), _ = testing.assert_kernel_equals_body(_kernel(A.ReLU), A.ReLU(),
                                                (x,))
    (gx,), _ = testing.assert_kernel_equals_body(
        _kernel(A.ReLUGrad), A.ReLUGrad(), (y, lay(_rand(rng, n, c, h, h))))
    for out in (y, gx):   # the output keeps the inputs' layout
        assert out.strides == x.strides


@pytest.mark.parametrize('gy_layout', ['nchw', 'cnhw'])
def test_relu_grad_takes_gy_in_another_layout_and_returns_ys(gy_layout):
    # where the kernels' layouts meet, a gradient summed from two layouts
    # comes C-ordered: the result goes on in y's layout
    rng = numpy.random.default_rng(8)
    y = _channels_last(_rand(rng, 4, 16, 16, 16))
    gy = _LAYOUTS[gy_layout](_rand(rng, 4, 16, 16, 16))
    (gx,), _ = testing.assert_kernel_equals_body(
        _kernel(A.ReLUGrad), A.ReLUGrad(), (y, gy))
    assert gx.strides == y.strides


# -- the sum of two gradients (Add) --------------------------------------------
@pytest.mark.parametrize('layout', ['nchw', 'nhwc', 'cnhw'])
def test_add_kernel_equals_body_bit_for_bit(layout, monkeypatch):
    # an IEEE sum either way; the output lies as the inputs do, and the
    # node holds the shapes its backward reads
    monkeypatch.setattr(onednn._binary, '_MIN_ADD', 1)
    rng = numpy.random.default_rng(5)
    lay = _LAYOUTS[layout]
    a, b = lay(_rand(rng, 4, 16, 5, 5)), lay(_rand(rng, 4, 16, 5, 5))
    (y,), _ = testing.assert_kernel_equals_body(_kernel(M.Add), M.Add(),
                                                (a, b))
    assert y.strides == a.strides
    node = M.Add()
    _kernel(M.Add)(node, (a, b))
    assert node.shapes == (a.shape, b.shape)


def test_add_declines_what_is_not_one_dense_layout():
    rng = numpy.random.default_rng(6)
    add = _kernel(M.Add)
    big = _rand(rng, 2, 64, 64, 64)   # at _MIN_ADD
    assert add(M.Add(), (big, big + 1)) is not None
    for a, b in [(big, _channels_last(big)),               # two layouts
                 (big, big[:1]),                           # broadcast
                 (big.astype(numpy.float64),) * 2,         # dtype
                 (big[:, :, ::2], big[:, :, ::2]),         # gaps
                 (big[:, :1, :4], big[:, :1, :4])]:        # small
        assert add(M.Add(), (a, b)) is None, (a.shape, a.strides)


# -- pooling ------------------------------------------------------------------
# ResNet-50's one max pooling: 3x3/2, pad 1, after the 7x7/2 stem at 224
# (112 -> 56), without cover_all; with it, and another map size, too.
MAX_POOLS = [((2, 64, 112), 3, 2, 1, False), ((2, 64, 112), 3, 2, 1, True),
             ((2, 8, 11), 3, 2, 1, True), ((2, 8, 10), 2, 2, 0, False)]


def _overlap(g):
    """How many windows share a pixel at most: the terms a gradient sums."""
    return math.ceil(g.kh / g.sy) * math.ceil(g.kw / g.sx)


@pytest.mark.parametrize('shape, k, s, p, cover_all', MAX_POOLS)
@pytest.mark.parametrize('layout', ['nchw', 'nhwc'])
def test_max_pooling_kernels_equal_bodies(shape, k, s, p, cover_all,
                                          layout):
    # C-ordered and channels-last (a batch normalization kernel's output)
    rng = numpy.random.default_rng(k + s + shape[2])
    n, c, h = shape
    lay = _LAYOUTS[layout]
    x = lay(_rand(rng, n, c, h, h))
    g = P._pool_geometry('max_pooling_2d', x, k, s, p, cover_all)
    # forward: the same maxima, and the same indexes (0 tolerance)
    (y,), _ = testing.assert_kernel_equals_body(
        _kernel(P.MaxPooling2D), P.MaxPooling2D(g), (x,))
    assert y.strides == lay(y).strides   # the input's layout
    gy = lay(_rand(rng, *y.shape))
    body = P.MaxPooling2D(g)
    body.forward((x,))
    numpy_node = P.MaxPooling2D(g)
    kernels.registered(P.MaxPooling2D, 'numpy')(numpy_node, (x,))
    # backward: from the body's int32 indexes, the NumPy kernel's int8
    # ones and oneDNN's own uint8 ones alike
    onednn_node = P.MaxPooling2D(g)
    _kernel(P.MaxPooling2D)(onednn_node, (x,))
    for indexes in (body.indexes, numpy_node.indexes, onednn_node.indexes):
        (gx,), _ = testing.assert_kernel_equals_body(
            _kernel(P.MaxPooling2DGrad), P.MaxPooling2DGrad(g, indexes),
            (gy,), atol=_sum_tol(_overlap(g), abs(gy).max()))
        assert gx.strides == x.strides


@pytest.mark.parametrize('layout', ['nchw', 'nhwc'])
def test_the_numpy_kernels_take_the_onednn_indexes(layout):
    # The backward may run on the NumPy kernels (a gy oneDNN declines)
    # after a oneDNN forward, and the double backward always does; on
    # channels-last x the indexes lie over NHWC memory too.
    rng = numpy.random.default_rng(5)
    x = _LAYOUTS[layout](_rand(rng, 2, 4, 11, 11))
    g = P._pool_geometry('max_pooling_2d', x, 3, 2, 1, False)
    node = P.MaxPooling2D(g)
    _kernel(P.MaxPooling2D)(node, (x,))
    gy = _rand(rng, 2, 4, g.oh, g.ow)
    for node_type, inputs in ((P.MaxPooling2DGrad, (gy,)),
                              (P.MaxPooling2DGather, (x,))):
        testing.assert_kernel_equals_body(
            kernels.registered(node_type, 'numpy'),
            node_type(g, node.indexes), inputs,
            atol=_sum_tol(_overlap(g), abs(inputs[0]).max()))


@pytest.mark.parametrize('shape, k, s, p', [
    ((2, 64, 112), 3, 2, 1), ((2, 8, 11), 3, 2, 1), ((2, 8, 10), 2, 2, 0)])
@pytest.mark.parametrize('layout', ['nchw', 'nhwc'])
def test_average_pooling_kernels_equal_bodies(shape, k, s, p, layout):
    rng = numpy.random.default_rng(k + s + shape[2])
    n, c, h = shape
    lay = _LAYOUTS[layout]
    x = lay(_rand(rng, n, c, h, h))
    g = P._pool_geometry('average_pooling_2d', x, k, s, p, False)
    (y,), _ = testing.assert_kernel_equals_body(
        _kernel(P.AveragePooling2D), P.AveragePooling2D(g), (x,),
        atol=_sum_tol(k * k, abs(x).max()))
    gy = lay(_rand(rng, *y.shape))
    (gx,), _ = testing.assert_kernel_equals_body(
        _kernel(P.AveragePooling2DGrad), P.AveragePooling2DGrad(g), (gy,),
        atol=_sum_tol(_overlap(g), abs(gy).max()))
    assert y.strides == lay(y).strides and gx.strides == x.strides


# the last maps of ResNet-50: 224 (imagenet stem), 32 (small), 28 (small2)
@pytest.mark.parametrize('h', [7, 4, 2])
def test_global_average_pooling_kernel_equals_body(h):
    x = _rand(numpy.random.default_rng(h), 2, 2048, h, h)
    testing.assert_kernel_equals_body(
        _kernel(P.GlobalAveragePooling2D), P.GlobalAveragePooling2D(), (x,),
        atol=_sum_tol(h * h, abs(x).max()))


# -- linear -------------------------------------------------------------------
@pytest.mark.parametrize('n, i, o', [(2, 2048, 10), (2, 2048, 1000)])
def test_linear_kernels_equal_bodies(n, i, o):
    rng = numpy.random.default_rng(o)
    x, W, b, gy = (_rand(rng, n, i), _rand(rng, o, i), _rand(rng, o),
                   _rand(rng, n, o))
    products = (abs(x) @ abs(W).T).max()
    linear = _kernel(LinearFunction)
    testing.assert_kernel_equals_body(linear, LinearFunction(), (x, W, b),
                                      atol=_sum_tol(i + 1, products
                                                    + abs(b).max()))
    testing.assert_kernel_equals_body(linear, LinearFunction(), (x, W),
                                      atol=_sum_tol(i, products))
    matmul = _kernel(M.MatMul)
    # gx = gy @ W (backward data), gW = gy^T @ x (backward weights; gy^T
    # is the transposed view of a C-ordered gy, as linear's backward has it)
    testing.assert_kernel_equals_body(matmul, M.MatMul(), (gy, W),
                                      atol=_sum_tol(o, (abs(gy)
                                                        @ abs(W)).max()))
    testing.assert_kernel_equals_body(matmul, M.MatMul(), (gy.T, x),
                                      atol=_sum_tol(n, (abs(gy).T
                                                        @ abs(x)).max()))


# -- what they decline --------------------------------------------------------
def _geometry(x, cover_all=False):
    return P._pool_geometry('max_pooling_2d', x, 3, 2, 1, cover_all)


def test_other_dtypes_and_layouts_are_declined():
    rng = numpy.random.default_rng(0)
    x = _rand(rng, 2, 4, 6, 6)
    g = _geometry(x)
    strided = numpy.asfortranarray(x)
    big = _rand(rng, 2, 64, 16, 16)    # above activation._MIN_SIZE
    for dtype in (numpy.float64, numpy.float16):
        a, b = x.astype(dtype), big.astype(dtype)
        assert _kernel(A.ReLU)(A.ReLU(), (b,)) is None
        assert _kernel(A.ReLUGrad)(A.ReLUGrad(), (b, b)) is None
        assert _kernel(P.MaxPooling2D)(P.MaxPooling2D(g), (a,)) is None
        assert _kernel(P.AveragePooling2D)(P.AveragePooling2D(g),
                                           (a,)) is None
        assert _kernel(P.GlobalAveragePooling2D)(
            P.GlobalAveragePooling2D(), (a,)) is None
        m = a.reshape(8, 36)
        assert _kernel(LinearFunction)(LinearFunction(), (m, m)) is None
        assert _kernel(M.MatMul)(M.MatMul(), (m, m.T.copy())) is None
    node = A.ReLU()
    assert _kernel(A.ReLU)(node, (big[..., ::2],)) is None   # gaps
    assert node._output_indexes_to_retain is None   # nothing half-done
    assert _kernel(P.MaxPooling2D)(P.MaxPooling2D(g), (strided,)) is None
    # a product whose first operand is neither C- nor F-ordered
    m = _rand(rng, 8, 12)[:, ::2]
    assert _kernel(M.MatMul)(M.MatMul(), (m, _rand(rng, 6, 3))) is None


def test_small_arrays_are_left_to_the_numpy_relu():
    # where the NumPy kernel measured as fast (activation._MIN_SIZE)
    rng = numpy.random.default_rng(6)
    small, large = _rand(rng, 32, 100), _rand(rng, 100, 1000)
    assert _kernel(A.ReLU)(A.ReLU(), (small,)) is None
    assert _kernel(A.ReLU)(A.ReLU(), (large,)) is not None
    assert _kernel(A.ReLUGrad)(A.ReLUGrad(), (small, small)) is None


def test_max_pooling_with_nan_is_declined_and_propagates_nan():
    # oneDNN's maximum skips NaN; the body's (and the NumPy kernel's) let
    # it win: the kernel declines, the seam runs the NumPy kernel.
    x = _rand(numpy.random.default_rng(1), 2, 4, 6, 6)
    x[0, 1, 2, 3] = numpy.nan
    g = _geometry(x)
    assert _kernel(P.MaxPooling2D)(P.MaxPooling2D(g), (x,)) is None
    y, = kernels.forward(P.MaxPooling2D(g), (x,))
    assert numpy.isnan(y[0, 1]).any()


# -- what each kernel used to get wrong (issue 44; the property test,
# test_kernel_properties.py, tries such inputs at random) -------------------
@pytest.mark.parametrize('view', ['stepped', 'reversed', 'broadcast'])
def test_a_convolution_bias_that_is_a_view(view):
    from minichain.functions.convolution import Convolution2D
    rng = numpy.random.default_rng(7)
    x, W, p = _rand(rng, 2, 3, 8, 8), _rand(rng, 4, 3, 3, 3), _rand(rng, 8)
    b = {'stepped': p[::2], 'reversed': p[:4][::-1],
         'broadcast': numpy.broadcast_to(p[:1], (4,))}[view]
    node = Convolution2D((1, 1), (1, 1), False, (1, 1), 1)
    testing.assert_kernel_equals_body(
        kernels.registered(Convolution2D, 'onednn'), node, (x, W, b),
        atol=_sum_tol(27, abs(x).max() * abs(W).max()) + 4 * U * 3)


def test_relu_keeps_nan_and_its_backward_the_bodys_zeros(monkeypatch):
    monkeypatch.setattr(onednn.activation, '_MIN_SIZE', 0)
    relu, grad = _kernel(A.ReLU), _kernel(A.ReLUGrad)
    x = _rand(numpy.random.default_rng(8), 4, 8, 6, 6)
    assert relu(A.ReLU(), (x,)) is not None      # it takes finite x...
    x[1, 2, 3, 4] = numpy.nan
    y, = kernels.forward(A.ReLU(), (x,))          # ...and leaves NaN
    assert numpy.isnan(y[1, 2, 3, 4])
    y = numpy.maximum(x, 0)
    for at, value in (((0, 0, 0, 0), numpy.inf), ((1, 2, 3, 4), 1.0)):
        gy = numpy.ones_like(x)
        gy[at] = value       # inf where y is 0; 1 where y is NaN
        want, = A.ReLUGrad().forward((y, gy))
        got, = kernels.forward(A.ReLUGrad(), (y, gy))
        numpy.testing.assert_array_equal(got, want)  # NaN, 0: the body's
    finite = numpy.nan_to_num(y)                  # it takes finite ones
    assert grad(A.ReLUGrad(), (finite, numpy.ones_like(x))) is not None


def test_max_pooling_over_minus_infinity_gives_minus_infinity():
    x = _rand(numpy.random.default_rng(9), 2, 4, 6, 6)
    x[0, 1, :2, :2] = -numpy.inf            # the first 2x2 window
    g = P._pool_geometry('max_pooling_2d', x, 2, 2, 0, False)
    y, = kernels.forward(P.MaxPooling2D(g), (x,))
    assert y[0, 1, 0, 0] == -numpy.inf and numpy.isfinite(y[1]).all()
    gy = numpy.ones(y.shape, F32)
    gy[0, 0, 1, 1] = numpy.inf           # the body spreads inf * 0 (NaN)
    node = P.MaxPooling2D(g)
    node.forward((numpy.nan_to_num(x),))
    want, = P.MaxPooling2DGrad(g, node.indexes).forward((gy,))
    got, = kernels.forward(P.MaxPooling2DGrad(g, node.indexes), (gy,))
    numpy.testing.assert_array_equal(got, want)


def test_batch_normalization_with_relu_keeps_nan():
    from minichain.functions import normalization as N
    from minichain.functions.channel_layout import Layout
    x = _channels_last(_rand(numpy.random.default_rng(10), 4, 8, 6, 6))
    x[1, 2, 3, 4] = numpy.nan
    gamma, beta = numpy.ones(8, F32), numpy.zeros(8, F32)
    node = N.BatchNormalization(Layout(x.shape, (0, 2, 3)), 2e-5, None,
                                None, 0.9, relu=True)
    y, = kernels.forward(node, (x, gamma, beta))
    assert numpy.isnan(y[:, 2]).all() and not numpy.isnan(y[:, 3]).any()


def test_a_window_wholly_in_the_padding_is_declined():
    # cover_all with a stride beyond the window: the last window reads
    # only padding (the body gives -inf there); oneDNN has no such window
    x = _rand(numpy.random.default_rng(2), 1, 2, 5, 5)
    g = P._pool_geometry('max_pooling_2d', x, 2, 4, 1, True)
    assert _kernel(P.MaxPooling2D)(P.MaxPooling2D(g), (x,)) is None


def test_the_seam_falls_back_to_the_numpy_kernels(monkeypatch):
    # Registered or not, a kernel that declines leaves the op to the next
    # one: float64 through every oneDNN kernel here gives the NumPy path's
    # result exactly.
    for node_type, kernel in onednn.UNREGISTERED:
        monkeypatch.setitem(kernels.registry, (node_type, 'onednn'),
                            onednn._gated(kernel))
    x = numpy.random.default_rng(3).standard_normal((2, 4, 6, 6))
    g = _geometry(x)
    for node in (A.ReLU(), P.MaxPooling2D(g), P.AveragePooling2D(g),
                 P.GlobalAveragePooling2D()):
        got, = kernels.forward(node, (x,))
        numpy_kernel = kernels.registered(type(node), 'numpy')
        want, = (numpy_kernel or type(node).forward)(type(node)(*(
            (g,) if hasattr(node, 'g') else ())), (x,))
        numpy.testing.assert_array_equal(got, want)


# -- the weights' reordered copy (off by default) -----------------------------
def test_cached_weights_last_until_the_parameters_change(monkeypatch):
    from minichain import links, optimizers
    from minichain.functions import convolution as C
    from minichain.kernels.onednn import _plan
    monkeypatch.setattr(_plan, 'CACHE_WEIGHTS', True)
    monkeypatch.setattr(_plan, '_weights', {})
    rng = numpy.random.default_rng(4)
    link = links.Convolution2D(16, 16, 3, pad=1, nobias=True)
    optimizer = optimizers.MomentumSGD(lr=0.1).setup(link)
    x = _rand(rng, 2, 16, 8, 8)
    conv = kernels.registered(C.Convolution2D, 'onednn')

    def node():
        return C.Convolution2D((1, 1), (1, 1), False, (1, 1), 1)

    def check(stale=False):
        W = link.W.array
        y, = conv(node(), (x, W))
        ref, = node().forward((x, W))
        tol = 2 * 16 * 9 * U * node().forward(
            (abs(x), abs(W)))[0] + 1e-30
        assert numpy.all(abs(y - ref) <= tol) != stale
    check()
    check()
    assert len(_plan._weights) == 1     # one copy, made once
    link.W.grad = _rand(rng, *link.W.shape)
    optimizer.update()                  # in place: the copy is stale now
    check()
    # A write the kernels are not told of is served the old copy (why the
    # cache is off): parameters_changed() is the way to tell them.
    link.W.array[...] *= -1
    check(stale=True)
    kernels.parameters_changed()
    check()
