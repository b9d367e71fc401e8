"""The GPU-shaped convolution kernels (minichain/kernels/cuda/
convolution.py), run on NumPy arrays with their im2col / col2im CUDA
kernels emulated in C++, equal the op bodies at ResNet-50's shapes
(batch 2) and on a grouped, dilated, cover_all geometry."""
import numpy
import pytest

from minichain.functions import convolution as C
from minichain.functions.geometry import conv_outsize
from minichain.kernels.cuda import convolution as K
from tests.functions.cuda_emulation import emulated_cuda  # noqa: F401


@pytest.fixture(autouse=True)
def _columns_in_cpp(emulated_cuda):  # noqa: F811
    """The columns come from the CUDA kernels, run as C++ on the CPU."""

# name: (x shape, W shape, stride, pad, dilate, groups, cover_all)
CASES = {
    'stem 7x7/2': ((2, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1, 1, False),
    '1x1 56 in': ((2, 256, 56, 56), (64, 256, 1, 1), 1, 0, 1, 1, False),
    '1x1 56 out': ((2, 64, 56, 56), (256, 64, 1, 1), 1, 0, 1, 1, False),
    '3x3 56': ((2, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1, 1, False),
    '3x3/2 56': ((2, 128, 56, 56), (128, 128, 3, 3), 2, 1, 1, 1, False),
    '1x1/2 28 projection': ((2, 512, 28, 28), (1024, 512, 1, 1), 2, 0, 1, 1,
                            False),
    '3x3 7': ((2, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1, 1, False),
    '1x1 7': ((2, 2048, 7, 7), (512, 2048, 1, 1), 1, 0, 1, 1, False),
    'grouped dilated cover_all': ((3, 4, 9, 10), (6, 2, 3, 2), 2, 1, 2, 2,
                                  True),
    '1x1/2 cover_all': ((2, 4, 8, 8), (3, 4, 1, 1), 3, 0, 1, 1, True),
    'uneven pads and dilations': ((2, 4, 9, 10), (5, 4, 3, 2), 1, (2, 0),
                                  (1, 2), 1, False),
}


def _rand(shape, seed):
    return numpy.random.default_rng(seed).standard_normal(shape).astype(
        numpy.float32)


def _same(got, want):
    """Equal to float32 accuracy: the sums run in another order."""
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = float(numpy.abs(want).max()) or 1.0
    numpy.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


def _both(node_type, kernel, args, inputs):
    body, fast = node_type(*args), node_type(*args)
    want, = body.forward(inputs)
    got, = kernel(fast, inputs)
    _same(got, want)
    assert fast._input_indexes_to_retain == body._input_indexes_to_retain
    assert vars(fast).keys() == vars(body).keys()  # no attribute left out


def _setup(case):
    xs, ws, s, p, d, groups, cover_all = CASES[case]
    s, p, d = (v if isinstance(v, tuple) else (v, v) for v in (s, p, d))
    out = tuple(conv_outsize(xs[2 + a], ws[2 + a], s[a], p[a], cover_all,
                             d[a]) for a in (0, 1))
    return xs, ws, s, p, d, groups, cover_all, out


@pytest.mark.parametrize('case', sorted(CASES))
def test_convolution_equals_the_body(case):
    xs, ws, s, p, d, groups, cover_all, _ = _setup(case)
    x, W, b = _rand(xs, 0), _rand(ws, 1), _rand(ws[0], 2)
    args = (s, p, cover_all, d, groups)
    _both(C.Convolution2D, K.convolution_2d, args, (x, W))
    _both(C.Convolution2D, K.convolution_2d, args, (x, W, b))


@pytest.mark.parametrize('case', sorted(CASES))
def test_deconvolution_equals_the_body(case):
    """The convolution's input gradient: gy of the output's shape back to
    the input's (outsize)."""
    xs, ws, s, p, d, groups, cover_all, out = _setup(case)
    gy, W = _rand(xs[:1] + ws[:1] + out, 3), _rand(ws, 1)
    b = _rand(ws[1] * groups, 4)
    args = (s, p, xs[2:], cover_all, d, groups)
    _both(C.Deconvolution2D, K.deconvolution_2d, args, (gy, W))
    _both(C.Deconvolution2D, K.deconvolution_2d, args, (gy, W, b))


@pytest.mark.parametrize('case', sorted(CASES))
def test_weight_gradient_equals_the_body(case):
    xs, ws, s, p, d, groups, cover_all, out = _setup(case)
    x, gy = _rand(xs, 0), _rand(xs[:1] + ws[:1] + out, 3)
    _both(C.Convolution2DGradW, K.convolution_2d_grad_w,
          (ws, s, p, cover_all, d, groups), (x, gy))


def test_small_column_groups_give_the_same_result(monkeypatch):
    """Images in groups of one (the column budget of a large batch)."""
    monkeypatch.setattr(K, 'COLUMN_BYTES', 1)
    for case in ('3x3/2 56', 'grouped dilated cover_all'):
        test_convolution_equals_the_body(case)
        test_deconvolution_equals_the_body(case)
        test_weight_gradient_equals_the_body(case)


def test_register_names_the_three_nodes_for_cuda():
    seen = []
    K.register(lambda node_type, backend, kernel: seen.append(
        (node_type.__name__, backend, kernel.__name__)))
    assert seen == [
        ('Convolution2D', 'cuda', 'convolution_2d'),
        ('Deconvolution2D', 'cuda', 'deconvolution_2d'),
        ('Convolution2DGradW', 'cuda', 'convolution_2d_grad_w')]


def test_fp32_math_sets_cublas_tf32_around_the_products(monkeypatch):
    # No GPU here: the wrapped kernels run on NumPy while the cuBLAS
    # switch is recorded. 'bf16' and 'tf32' run TF32 (CuPy has no
    # bfloat16 compute for float32), set for the call and put back;
    # 'strict' and a TF32 already on leave the switch alone.
    import minichain
    from minichain import backend, kernels
    from minichain.functions.basic_math import MatMul
    state, calls = {'on': False}, []
    monkeypatch.setattr(backend, 'tf32_enabled', lambda: state['on'])

    def set_tf32(on):
        calls.append(on)
        state['on'] = on
    monkeypatch.setattr(backend, 'set_tf32', set_tf32)
    a = numpy.ones((2, 3), numpy.float32)
    for mode, on_before, want_calls in (('strict', False, []),
                                        ('bf16', False, [True, False]),
                                        ('tf32', False, [True, False]),
                                        ('bf16', True, [])):
        calls.clear()
        state['on'] = on_before
        kernel = kernels.registered(MatMul, 'cuda')
        with minichain.using_config('fp32_math', mode):
            y, = kernel(MatMul(), (a, a.T))
        assert calls == want_calls, mode
        assert state['on'] == on_before       # put back
        numpy.testing.assert_array_equal(y, numpy.full((2, 2), 3.0))
    conv = kernels.registered(C.Convolution2D, 'cuda')
    calls.clear()
    state['on'] = False
    with minichain.using_config('fp32_math', 'bf16'):
        conv(C.Convolution2D((1, 1), (0, 0), False, (1, 1), 1),
             (numpy.ones((1, 2, 3, 3), numpy.float32),
              numpy.ones((4, 2, 1, 1), numpy.float32)))
    assert calls == [True, False]
