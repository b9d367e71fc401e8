"""gradient_check: numerical gradients, and checks that pass and that fail."""
import numpy
import pytest

import minichain.functions as F
from minichain import FunctionNode, Parameter
from minichain.gradient_check import (check_backward, check_double_backward,
                                      numerical_grad)

TIGHT = dict(eps=1e-5, atol=1e-7, rtol=1e-6)


def rand(*shape, low=0.5, high=1.5, seed=0):
    return numpy.random.default_rng(seed).uniform(low, high, shape)


def test_numerical_grad_matches_a_known_derivative():
    x = rand(2, 3)
    gy = rand(2, 3, seed=1)
    gx, = numerical_grad(lambda: numpy.sin(x), (x,), (gy,), eps=1e-5)
    assert gx.dtype == numpy.float64 and gx.shape == x.shape
    numpy.testing.assert_allclose(gx, numpy.cos(x) * gy, rtol=1e-8)
    numpy.testing.assert_array_equal(x, rand(2, 3))  # inputs restored


def test_numerical_grad_two_inputs_two_outputs():
    a, b = rand(3), rand(3, seed=1)
    ga, gb = numerical_grad(lambda: (a * b, a + b), (a, b),
                            (numpy.ones(3), 2 * numpy.ones(3)), eps=1e-4)
    numpy.testing.assert_allclose(ga, b + 2, rtol=1e-8)
    numpy.testing.assert_allclose(gb, a + 2, rtol=1e-8)


def test_numerical_grad_of_a_view_of_the_input():
    # The output aliases the input being perturbed: it must be copied.
    x = rand(4)
    gx, = numerical_grad(lambda: x[1:].T, (x,), (numpy.ones(3),), eps=1e-4)
    numpy.testing.assert_allclose(gx, [0.0, 1.0, 1.0, 1.0], rtol=1e-8)
    check_backward(lambda a: a[1:], x, rand(3), **TIGHT)


def test_numerical_grad_float32_uses_the_step_actually_taken():
    x = numpy.array([1000.1], numpy.float32)  # x + eps rounds noticeably
    gx, = numerical_grad(lambda: 3 * x, (x,), (numpy.ones(1),), eps=1e-3)
    numpy.testing.assert_allclose(gx, [3.0], rtol=1e-6)


@pytest.mark.parametrize('dtype,tol', [
    (numpy.float64, TIGHT),
    (numpy.float32, dict(eps=1e-2, atol=1e-3, rtol=1e-3))])
def test_check_backward_passes_on_correct_functions(dtype, tol):
    x, w = rand(2, 3).astype(dtype), rand(2, 3, seed=1).astype(dtype)
    gy = rand(2, 3, seed=2).astype(dtype)
    check_backward(lambda a, b: a * b + a ** 3, (x, w), gy, **tol)
    check_backward(lambda a: F.sum(a * a), x, None, **tol)  # scalar output
    check_backward(lambda a, b: (a * b, a - b), (x, w), (gy, gy), **tol)


def test_check_backward_with_params_and_integer_inputs():
    p = Parameter(rand(3, seed=3), name='W')
    idx = numpy.array([2, 0, 0])
    check_backward(lambda a, i: a[i.array] * p[i.array], (rand(3), idx),
                   rand(3, seed=4), params=(p,), **TIGHT)


def test_check_backward_dtype_casts_float32_for_a_precise_check():
    p = Parameter(rand(3, seed=3).astype(numpy.float32))
    check_backward(lambda a: a * p, rand(3).astype(numpy.float32),
                   rand(3).astype(numpy.float32), params=(p,),
                   dtype=numpy.float64, **TIGHT)
    assert p.dtype == numpy.float32  # restored afterwards


class Cube(FunctionNode):
    """x ** 3 with a backward that can be broken on purpose."""

    def __init__(self, bug=None):
        self.bug = bug

    def forward(self, inputs):
        self.retain_inputs((0,))
        return inputs[0] ** 3,

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        gx = grad_outputs[0] * 3 * x * x
        if self.bug is not None:
            gx = gx + self.bug
        return gx,


def cube(x, bug=None):
    return Cube(bug).apply((x,))[0]


def test_check_backward_fails_on_a_planted_wrong_backward():
    x = rand(2, 3)
    check_backward(cube, x, numpy.ones((2, 3)), **TIGHT)  # correct: passes
    bug = numpy.zeros((2, 3))
    bug[1, 2] = 0.01  # one wrong element
    with pytest.raises(AssertionError) as info:
        check_backward(lambda a: cube(a, bug), x, numpy.ones((2, 3)), **TIGHT)
    msg = str(info.value)
    assert 'input 0' in msg and '(1, 2)' in msg
    analytic = 3 * x[1, 2] ** 2 + 0.01
    assert repr(float(analytic))[:8] in msg
    assert repr(float(3 * x[1, 2] ** 2))[:6] in msg
    assert 'tolerance' in msg and '1 of 6 elements' in msg


def test_check_backward_names_the_wrong_input_and_param():
    x, y = rand(3), rand(3, seed=1)
    with pytest.raises(AssertionError, match='input 1'):
        check_backward(lambda a, b: a + cube(b, 1e-3), (x, y), rand(3),
                       **TIGHT)
    p = Parameter(rand(3, seed=2), name='W')
    with pytest.raises(AssertionError, match="param 'W'"):
        check_backward(lambda a: a * cube(p, 1e-3), x, rand(3),
                       params=(p,), **TIGHT)


def test_check_backward_checks_the_output_gradient_shape():
    with pytest.raises(ValueError, match='y_grad shape'):
        check_backward(cube, rand(3), numpy.ones(4))


class CubeGradOnlyFirstOrder(Cube):
    """Correct first derivative, but built from a node whose own backward is
    wrong: only the second derivative is off."""

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        return grad_outputs[0] * _BadSquare().apply((x,))[0] * 3,


class _BadSquare(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0,))
        return inputs[0] ** 2,

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        return grad_outputs[0] * x * 2.1,  # should be 2


def test_check_double_backward_passes_and_fails():
    x, gy, ggx = rand(3), rand(3, seed=1), rand(3, seed=2)
    check_double_backward(cube, x, gy, ggx, **TIGHT)
    check_double_backward(F.tanh, x, gy, ggx, **TIGHT)
    bad = lambda a: CubeGradOnlyFirstOrder().apply((a,))[0]  # noqa: E731
    check_backward(bad, x, gy, **TIGHT)  # first order is right
    with pytest.raises(AssertionError, match='input 0'):
        check_double_backward(bad, x, gy, ggx, **TIGHT)


def test_check_double_backward_with_params():
    p = Parameter(rand(3, seed=3), name='W')
    check_double_backward(lambda a: a * a * p * p, rand(3), rand(3, seed=1),
                          rand(3, seed=2), params=(p,),
                          params_grad_grad=(rand(3, seed=4),), **TIGHT)


def test_input_not_reaching_the_output_gets_a_zero_gradient():
    x, y = rand(3), rand(3, seed=1)
    check_backward(lambda a, b: a * 2, (x, y), rand(3), **TIGHT)
    check_double_backward(lambda a, b: a * a, (x, y), rand(3),
                          (rand(3), rand(3)), **TIGHT)


class _Tanh(FunctionNode):
    """tanh with its backward scaled by ``factor`` (1: correct)."""

    def __init__(self, factor):
        self.factor = factor

    def forward(self, inputs):
        self.retain_outputs((0,))
        return numpy.tanh(inputs[0]),

    def backward(self, indexes, grad_outputs):
        y, = self.get_retained_outputs()
        return grad_outputs[0] * (1 - y * y) * self.factor,


def _half(seed):
    rng = numpy.random.default_rng(seed)
    return (rng.uniform(-1, 1, (3, 4)).astype(numpy.float16),
            rng.standard_normal((3, 4)).astype(numpy.float16))


@pytest.mark.parametrize('seed', range(5))
def test_float16_defaults_pass_a_correct_tanh_and_fail_one_1pct_off(seed):
    x, gy = _half(seed)
    check_backward(F.tanh, x, gy)  # float16 rounding passes
    check_backward(lambda v: _Tanh(1.0).apply((v,))[0], x, gy)
    with pytest.raises(AssertionError, match='input 0 differs'):
        check_backward(lambda v: _Tanh(1.01).apply((v,))[0], x, gy)
    # at any scale of the output gradient
    check_backward(F.tanh, x, gy * numpy.float16(100))
    with pytest.raises(AssertionError):
        check_backward(lambda v: _Tanh(1.01).apply((v,))[0], x,
                       gy * numpy.float16(0.01))


def test_float16_given_tolerances_and_a_float64_check():
    x, gy = _half(0)
    wrong = lambda v: _Tanh(1.01).apply((v,))[0]  # noqa: E731
    check_backward(wrong, x, gy, atol=5e-2, rtol=5e-2)  # the user's choice
    check_backward(F.tanh, x, gy, dtype=numpy.float64, **TIGHT)
    with pytest.raises(AssertionError):
        check_backward(wrong, x, gy, dtype=numpy.float64, **TIGHT)


def test_float16_params_and_double_backward():
    p = Parameter(numpy.array([0.5, -0.25, 0.75], numpy.float16))
    x, _ = _half(1)
    gy = numpy.ones((3, 4), numpy.float16)
    check_backward(lambda v: F.tanh(v[:, :3] * p), x, gy[:, :3], params=[p])
    assert p.array.dtype == numpy.float16  # restored
    check_double_backward(F.tanh, x, gy, numpy.ones((3, 4), numpy.float16))


class _Off(FunctionNode):
    """The identity with its backward scaled by ``factor``: placed before
    an op, it plants a backward ``factor - 1`` off."""

    def __init__(self, factor):
        self.factor = factor

    def forward(self, inputs):
        return inputs[0].copy(),

    def backward(self, indexes, grad_outputs):
        return grad_outputs[0] * self.factor,


def _conv_case(seed):
    rng = numpy.random.default_rng(seed)
    x, W, gy = (rng.standard_normal(s).astype(numpy.float32) for s in
                ((2, 8, 6, 6), (8, 8, 3, 3), (2, 8, 6, 6)))
    return x, W, gy


@pytest.mark.parametrize('seed', range(3))
def test_bf16_compute_is_checked_against_float64_with_bf16_tolerances(seed):
    # Under fp32_math 'bf16' the convolution's products round to bfloat16
    # (on a CPU with the instructions; float32 elsewhere, which passes
    # too): float32 central differences of such a function are noise, so
    # the reference is float64 and the tolerances bfloat16's.
    import minichain
    x, W, gy = _conv_case(seed)

    def conv(factor):
        return lambda v, w: F.convolution_2d(_Off(factor).apply((v,))[0],
                                             w, pad=1)
    with minichain.using_config('fp32_math', 'bf16'):
        check_backward(conv(1.0), (x, W), gy)
        with pytest.raises(AssertionError, match='input 0 differs'):
            check_backward(conv(1.05), (x, W), gy)
        # a float64 check is float64's, whatever the switch says
        check_backward(conv(1.0), (x, W), gy, dtype=numpy.float64, **TIGHT)


def test_bfloat16_inputs_take_the_bf16_tolerances():
    ml_dtypes = pytest.importorskip('ml_dtypes')
    x, gy = (a.astype(ml_dtypes.bfloat16) for a in _half(0))
    check_backward(F.tanh, x, gy)
    with pytest.raises(AssertionError, match='input 0 differs'):
        check_backward(lambda v: _Tanh(1.05).apply((v,))[0], x, gy)
