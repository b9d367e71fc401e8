"""Numerical gradient checking: central differences in float64.

``check_backward`` compares the analytic gradient of ``func`` with a numerical
one element by element (two forwards per input element, so keep the inputs
tiny) and, on failure, names the input, the worst element, both values and
the tolerance.
"""
import numpy

from minichain import backend
from minichain.configuration import config, using_config
from minichain.function_node import FunctionNode
from minichain.variable import Variable


def numerical_grad(f, inputs, grad_outputs, eps=1e-3):
    """Central-difference gradients of ``sum(f() * grad_outputs)``.

    ``g[i] = sum((f(x + eps e_i) - f(x - eps e_i)) * gy) / (2 eps)``,
    accumulated in float64 (the divisor is the step actually taken once
    ``x +- eps`` is rounded to the input's dtype).

    Args:
        f: callable taking no arguments and returning an array or a tuple of
            arrays; it must read ``inputs`` (perturbed in place).
        inputs: tuple of float ndarrays to perturb.
        grad_outputs: tuple of arrays (or None) weighting each output.
        eps: step size.
    Returns:
        tuple of float64 arrays shaped like ``inputs``.
    """
    grads = []
    for x in inputs:
        xp = backend.get_array_module(x)
        gx = numpy.zeros(x.shape, dtype=numpy.float64)
        flat = x.reshape(-1) if x.flags.c_contiguous else None
        if flat is None:
            raise ValueError('numerical_grad: inputs must be C-contiguous')
        for i in range(x.size):
            orig = flat[i].copy()
            # Divide by the step actually taken: x + eps rounds in the
            # input's dtype (noticeably so in float32).
            flat[i] = orig + eps
            hi = float(flat[i])
            ys1 = _float64_copies(f())
            flat[i] = orig - eps
            lo = float(flat[i])
            ys2 = _float64_copies(f())
            flat[i] = orig
            if hi == lo:
                raise ValueError('numerical_grad: eps {} is too small for '
                                 'dtype {}'.format(eps, x.dtype))
            d = 0.0
            for y1, y2, gy in zip(ys1, ys2, grad_outputs):
                if gy is not None:
                    d += float(((y1 - y2) * backend.to_cpu(gy)).sum())
            gx.reshape(-1)[i] = d / (hi - lo)
        grads.append(gx if xp is numpy else xp.asarray(gx))
    return tuple(grads)


def _float64_copies(ys):
    # Copy at once: an output may be a view of the input being perturbed.
    return [backend.to_cpu(y).astype(numpy.float64) for y in _as_tuple(ys)]


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _arrays(outputs):
    return tuple(y.array if isinstance(y, Variable) else y
                 for y in _as_tuple(outputs))


HALF_RTOL, HALF_ATOL = 5e-3, 2e-3
# bfloat16 keeps 8 significant bits (7 stored): eps = 2**-7, and rounding
# to it is off by at most u = 2**-8 of the value. A product of two
# factors rounded to bfloat16 is off by 2u + u^2, about BF16_EPS, of its
# size; a gradient goes through two or three such products (the forward
# and the backward) and float32 sums, hence 4 eps relative and 2 eps of
# the largest gradient absolute: they pass bfloat16's rounding of a
# correct backward and fail one that is 5% off.
BF16_EPS = 2.0 ** -7
BF16_RTOL, BF16_ATOL = 4 * BF16_EPS, 2 * BF16_EPS


def check_backward(func, x_data, y_grad, params=(), eps=1e-3, atol=None,
                   rtol=None, dtype=None, no_grads=None):
    """Assert that ``func``'s backward matches numerical differentiation.

    Each element must satisfy ``|analytic - numerical| <= atol + rtol *
    |numerical|``.

    **float16.** Steps of ``eps`` are too coarse in float16 (its spacing
    near 1 is 1e-3), so when an input or param is float16 (and ``dtype`` is
    None) the numerical gradient is taken on float64 copies, and the
    default tolerances become ``rtol = 5e-3`` and ``atol = 2e-3`` times the
    largest ``|numerical|`` of that input or ``|y_grad|``: they pass
    float16's rounding of a correct backward (a few units in the last place
    of the values involved) and fail one that is 1% off wherever float16
    can tell (not on gradients far below the largest). To check the
    mathematics of a float16 function precisely, pass
    ``dtype=numpy.float64``.

    **bfloat16.** The same holds, with ``BF16_RTOL`` and ``BF16_ATOL``
    (4 and 2 times bfloat16's eps, 2^-7: see their comment), when an
    input or param is ``ml_dtypes.bfloat16`` or when float32 products
    compute in bfloat16 (``config.fp32_math == 'bf16'``): the numerical
    gradient is then taken on float64 copies, which no kernel rounds, so
    that it is the exact reference. ``dtype=numpy.float64`` checks in
    float64 with the float64 tolerances whatever the switch says.

    Args:
        func: callable taking Variables and returning a Variable or a tuple.
        x_data: an array or tuple of arrays (the inputs).
        y_grad: an array or tuple of arrays (the output gradients), or None
            for a scalar output (then 1 is used).
        params: Parameters (or Variables) used inside ``func`` whose
            gradients are checked too.
        eps: step size.
        atol, rtol: tolerances; None: 1e-5 and 1e-4 (float16 and
            bfloat16: see above).
        dtype: if given (e.g. numpy.float64), inputs and params are cast to
            it for the check, so that float32 code can be checked precisely.
        no_grads: per-input flags; True means the input gets no gradient
            (integer inputs are skipped automatically).
    Raises:
        AssertionError naming the input index, the worst element, both values
        and the tolerance.
    """
    x_data = _as_tuple(x_data)
    if dtype is not None:
        x_data = tuple(x.astype(dtype) if backend.is_float(x.dtype) else x
                       for x in x_data)
    low = None if dtype is not None else _low_precision(x_data, params)
    default_atol, default_rtol = {None: (1e-5, 1e-4),
                                  'float16': (HALF_ATOL, HALF_RTOL),
                                  'bfloat16': (BF16_ATOL, BF16_RTOL)}[low]
    tol = (default_atol if atol is None else atol,
           default_rtol if rtol is None else rtol,
           bool(low) and atol is None)
    if no_grads is None:
        no_grads = [not backend.is_float(x.dtype) for x in x_data]
    xs = [Variable(x.copy(), requires_grad=not ng)
          for x, ng in zip(x_data, no_grads)]
    saved_params = [p.array for p in params]
    try:
        if dtype is not None:
            for p in params:
                p.array = p.array.astype(dtype)
        _check_backward(func, xs, y_grad, params, eps, tol, bool(low))
    finally:
        for p, a in zip(params, saved_params):
            p.array = a


class _Seed(FunctionNode):
    """Joins the outputs into one dummy scalar whose backward hands each
    output exactly its ``y_grad``: the check then exercises ``func``'s
    backward alone, not also that of mul and sum."""

    def __init__(self, y_grad):
        self.y_grad = y_grad

    def forward(self, inputs):
        return backend.get_array_module(*inputs).zeros(()),

    def backward(self, indexes, grad_outputs):
        return tuple(None if self.y_grad[i] is None
                     else Variable(self.y_grad[i]) for i in indexes)


def _check_backward(func, xs, y_grad, params, eps, tol, wide):
    for p in params:
        p.cleargrad()
    ys = _as_tuple(func(*xs))
    if y_grad is None:
        if any(y.size != 1 for y in ys):
            raise ValueError('check_backward: y_grad is None but the output '
                             'has shape {}'.format(ys[0].shape))
        y_grad = tuple(y.xp.ones_like(y.array) for y in ys)
    y_grad = _as_tuple(y_grad)
    if len(y_grad) != len(ys):
        raise ValueError('check_backward: {} output gradients for {} outputs'
                         .format(len(y_grad), len(ys)))
    for y, gy in zip(ys, y_grad):
        if gy is not None and gy.shape != y.shape:
            raise ValueError('check_backward: y_grad shape {} differs from '
                             'the output shape {}'.format(gy.shape, y.shape))
    # The gradients are those of the outputs' own dtype.
    y_grad = tuple(None if gy is None else gy.astype(y.dtype, copy=False)
                   for y, gy in zip(ys, y_grad))
    _Seed(y_grad).apply(ys)[0].backward()

    targets = [x for x in xs if x.requires_grad] + list(params)
    # Read the analytic gradients now: ``func`` may touch them when the
    # numerical pass calls it again (check_double_backward's does).
    analytic = [None if v.grad is None else backend.to_cpu(v.grad).copy()
                for v in targets]

    # The numerical pass: on the inputs themselves, or on float64 copies
    # (``wide``, for float16), the params' arrays swapped for theirs.
    fxs = [Variable(_wide(x.array), requires_grad=x.requires_grad)
           for x in xs] if wide else xs
    saved = [p.array for p in params]
    if wide:
        for p in params:
            p.array = _wide(p.array)
    arrays = [x.array for x in fxs if x.requires_grad] + [
        p.array for p in params]

    def forward():
        with using_config('enable_backprop', False):
            return _arrays(func(*fxs))
    try:
        numeric = numerical_grad(forward, arrays, y_grad, eps)
    finally:
        for p, a in zip(params, saved):
            p.array = a
    atol, rtol, relative = tol
    ys_scale = [float(numpy.abs(backend.to_cpu(gy)).max(initial=0))
                for gy in y_grad if gy is not None]
    for k, (v, gana, gnum) in enumerate(zip(targets, analytic, numeric)):
        what = 'input {}'.format(xs.index(v)) if k < len(targets) - len(
            params) else 'param {!r}'.format(v.name)
        if gana is None:
            gana = numpy.zeros_like(gnum)
        gnum = backend.to_cpu(gnum)
        scale = max([1e-30, float(numpy.abs(gnum).max(initial=0))] +
                    ys_scale) if relative else 1.0
        _assert_close(what, backend.to_cpu(gana).astype(numpy.float64),
                      gnum, atol * scale, rtol)


def _low_precision(x_data, params):
    """'float16' or 'bfloat16' when the check runs in that precision (an
    input or param of the type, or float32 products computed in
    bfloat16), else None."""
    arrays = [a for a in list(x_data) + [p.array for p in params]
              if a is not None]
    if any(a.dtype == numpy.float16 for a in arrays):
        return 'float16'
    if any(a.dtype.name == 'bfloat16' for a in arrays) or (
            config.fp32_math == 'bf16'
            and any(a.dtype == numpy.float32 for a in arrays)):
        return 'bfloat16'
    return None


def _wide(a):
    return a.astype(numpy.float64) if backend.is_float(a.dtype) else a


def _assert_close(what, analytic, numeric, atol, rtol):
    if analytic.shape != numeric.shape:
        raise AssertionError('gradient of {} has shape {}, expected {}'
                             .format(what, analytic.shape, numeric.shape))
    err = numpy.abs(analytic - numeric)
    tol = atol + rtol * numpy.abs(numeric)
    if numpy.all(err <= tol):
        return
    worst = numpy.unravel_index(numpy.argmax(err - tol), err.shape)
    raise AssertionError(
        'check_backward: gradient of {} differs at index {}: analytic {!r} vs '
        'numerical {!r} (|diff| {:.3g} > tolerance {:.3g} = atol {} + rtol {} '
        '* |numerical|); {} of {} elements out of tolerance'.format(
            what, tuple(int(i) for i in worst), float(analytic[worst]),
            float(numeric[worst]), float(err[worst]), float(tol[worst]),
            atol, rtol, int((err > tol).sum()), err.size))


def check_double_backward(func, x_data, y_grad, x_grad_grad, params=(),
                          eps=1e-3, atol=None, rtol=None, dtype=None,
                          params_grad_grad=()):
    """Check second derivatives: the backward of ``func``'s backward.

    Builds ``g(x, gy) = d(sum(func(x) * gy))/d(x, params)`` with
    ``enable_double_backprop=True`` and runs :func:`check_backward` on it,
    so the gradients w.r.t. x, gy and params of ``sum(g * ggx)`` are checked.

    Args:
        func, x_data, y_grad, params, eps, dtype: as in
            :func:`check_backward`.
        atol, rtol: None: 1e-4 and 1e-3 (float16, bfloat16: as in
            check_backward).
        x_grad_grad: one array per floating-point input (the ``ggx``).
        params_grad_grad: one array per parameter.
    Raises:
        AssertionError as :func:`check_backward` does.
    """
    x_data = _as_tuple(x_data)
    y_grad = _as_tuple(y_grad)
    n_x = len(x_data)
    params = tuple(params)
    if dtype is not None or not _low_precision(x_data, params):
        atol = 1e-4 if atol is None else atol
        rtol = 1e-3 if rtol is None else rtol

    def first_order(*args):
        from minichain.configuration import force_backprop_mode
        from minichain.functions import sum as f_sum
        xs, gys = args[:n_x], args[n_x:]
        for v in params + args:
            v.cleargrad()
        # The numerical pass runs with backprop disabled; the first-order
        # gradient still needs its graph.
        with force_backprop_mode():
            ys = _as_tuple(func(*xs))
            total = None
            for y, gy in zip(ys, gys):
                term = f_sum(y * gy)
                total = term if total is None else total + term
            total.backward(enable_double_backprop=True)
        wrt = [x for x in xs if x.requires_grad] + list(params)
        grads = tuple(Variable(v.xp.zeros_like(v.array)) if v.grad_var is None
                      else v.grad_var for v in wrt)
        # The outer backward accumulates into the same variables.
        for v in params + args:
            v.cleargrad()
        return grads

    check_backward(first_order, x_data + y_grad,
                   _as_tuple(x_grad_grad) + tuple(params_grad_grad),
                   params=params, eps=eps, atol=atol, rtol=rtol, dtype=dtype)
