"""Shared helpers for the function tests (import them from any test file).

Stable API:
    DTYPES: ``[numpy.float32, numpy.float64]``, for ``pytest.mark.parametrize``.
    TOL[dtype]: keyword arguments (eps, atol, rtol) for ``check_backward``.
    TOL2[dtype]: the same for ``check_double_backward``.
    rand(shape, dtype, low=-1, high=1, seed=0): uniform random array.
    off_zero(shape, dtype, low=0.5, high=1.5, seed=0): random signs with
        ``low <= |x| <= high`` (keeps abs, relu and friends off their kink).
    distinct(shape, dtype, gap=0.5, seed=0): a shuffled arange scaled by
        ``gap`` and centred on 0: every pair differs by at least ``gap``
        (for max, min, maximum: no ties).
    grad_check(func, inputs, dtype, seed=0, **tol): ``check_backward`` with
        a random output gradient; tolerances default to ``TOL[dtype]``.
    double_grad_check(func, inputs, dtype, seed=0, **tol): the same for
        ``check_double_backward`` (random gy and ggx, ``TOL2[dtype]``).

Float64 checks are tight; float32 ones use a larger step and looser
tolerances because the numerical differences themselves are float32.
"""
import numpy

from minichain import Variable, config
from minichain.gradient_check import check_backward, check_double_backward

DTYPES = [numpy.float32, numpy.float64]

TOL = {
    numpy.float32: dict(eps=1e-2, atol=5e-3, rtol=5e-3),
    numpy.float64: dict(eps=1e-5, atol=1e-7, rtol=1e-6),
}
TOL2 = {
    numpy.float32: dict(eps=1e-2, atol=1e-2, rtol=1e-2),
    numpy.float64: dict(eps=1e-5, atol=1e-6, rtol=1e-5),
}


def rand(shape, dtype, low=-1.0, high=1.0, seed=0):
    """Uniform random array in ``[low, high)`` of ``shape`` and ``dtype``."""
    rng = numpy.random.default_rng(seed)
    return rng.uniform(low, high, shape).astype(dtype)


def off_zero(shape, dtype, low=0.5, high=1.5, seed=0):
    """Random array whose magnitudes lie in ``[low, high]``, random signs."""
    rng = numpy.random.default_rng(seed)
    mag = rng.uniform(low, high, shape)
    return (mag * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def distinct(shape, dtype, gap=0.5, seed=0):
    """Shuffled, evenly spaced values: no two closer than ``gap``."""
    rng = numpy.random.default_rng(seed)
    n = int(numpy.prod(shape))
    values = (numpy.arange(n) - (n - 1) / 2) * gap
    return rng.permutation(values).reshape(shape).astype(dtype)


def _output_grads(func, inputs, dtype, rng):
    """Random output gradients shaped like ``func``'s outputs."""
    ys = func(*[Variable(x.copy()) for x in inputs])
    ys = ys if isinstance(ys, tuple) else (ys,)
    return tuple(rng.uniform(-1, 1, y.shape).astype(dtype) for y in ys)


def _copy_outputs_when_numerical(func):
    """Copy ``func``'s outputs during the numerical pass (backprop off).

    Works around numerical_grad keeping the outputs of ``f(x + eps)`` while
    it evaluates ``f(x - eps)`` in place: an op whose forward returns a view
    of its input (reshape, transpose, broadcast_to, basic get_item, ...)
    would otherwise see both outputs change and get a zero numerical
    gradient. Harmless once gradient_check copies them itself.
    """
    def wrapped(*xs):
        ys = func(*xs)
        if config.enable_backprop:
            return ys
        ys = ys if isinstance(ys, tuple) else (ys,)
        return tuple(Variable(y.array.copy()) for y in ys)
    return wrapped


def grad_check(func, inputs, dtype, seed=0, **tol):
    """``check_backward(func, inputs, random gy)`` with ``TOL[dtype]``."""
    inputs = tuple(inputs)
    rng = numpy.random.default_rng(seed + 1000)
    gys = _output_grads(func, inputs, dtype, rng)
    check_backward(_copy_outputs_when_numerical(func), inputs, gys,
                   **{**TOL[dtype], **tol})


def double_grad_check(func, inputs, dtype, seed=0, **tol):
    """``check_double_backward`` with random gy and ggx and ``TOL2[dtype]``."""
    inputs = tuple(inputs)
    rng = numpy.random.default_rng(seed + 2000)
    gys = _output_grads(func, inputs, dtype, rng)
    ggxs = tuple(rng.uniform(-1, 1, x.shape).astype(dtype) for x in inputs
                 if x.dtype.kind == 'f')
    check_double_backward(func, inputs, gys, ggxs, **{**TOL2[dtype], **tol})
