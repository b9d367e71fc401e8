"""Proving a kernel equals its op's body: run both on copies and compare.

A kernel replaces ``node.forward`` (``minichain/kernels/__init__.py``), so
it must return what the body returns (the same dtypes and shapes, values
within a rounding tolerance), declare the same retained inputs and
outputs, and leave the node with the same attributes (which backward
reads) and the inputs untouched. :func:`assert_kernel_equals_body` checks
all of that for one node and one tuple of inputs::

    from minichain.kernels import registered, testing
    node = ReLU()
    testing.assert_kernel_equals_body(registered(ReLU, 'numpy'), node, (x,))

The tolerance is the caller's, derived from the arithmetic: a kernel may
sum in another order than the body (blocked BLAS, one-pass variances), and
a sum of K terms in float32 differs by about ``sqrt(K) * eps`` times its
largest term (:func:`sum_tolerance`). Where an output is computed without
sums (ReLU, Add), the tolerance is 0: the bits must be the same.

This module imports no kernel package; tests import it (docs/kernels.md).
"""
import copy
import math
import types

import numpy

from minichain import backend

__all__ = ['assert_kernel_equals_body', 'assert_update_equals_body',
           'sum_tolerance', 'run_both']


def sum_tolerance(n_terms, max_term, dtype, factor=8.0):
    """How far two orders of summing ``n_terms`` terms of magnitude at most
    ``max_term`` may differ in ``dtype``: ``factor * sqrt(n) * eps *
    max_term`` (rounding errors of a sum grow like the square root of the
    number of terms when they are independent; ``factor`` covers the
    distribution's tail and the final rounding of each partial sum)."""
    eps = float(numpy.finfo(dtype).eps)
    return factor * math.sqrt(max(1, n_terms)) * eps * float(max_term)


def _copy(a):
    """A copy in the same memory layout: the same strides (negative and
    zero ones included), byte order, address modulo 64 and writeability,
    since kernels take other routes, or decline, for other layouts."""
    if a is None or not backend.is_array(a):
        return copy.deepcopy(a)
    if backend.get_array_module(a) is not numpy:
        return a.copy()
    if a.size == 0:
        return a.copy(order='K')
    # the bytes the view spans, from its lowest address to its highest
    lo = sum(s * (n - 1) for s, n in zip(a.strides, a.shape) if s < 0)
    hi = sum(s * (n - 1) for s, n in zip(a.strides, a.shape) if s > 0)
    span = hi - lo + a.itemsize
    raw = numpy.empty(span + 64, numpy.uint8)
    shift = (a.ctypes.data + lo - raw.ctypes.data) % 64
    out = numpy.ndarray(a.shape, a.dtype, buffer=raw, offset=shift - lo,
                        strides=a.strides)
    out[...] = a   # along a zero stride, the same value written again
    out.flags.writeable = a.flags.writeable
    return out


def run_both(kernel, node, inputs):
    """``(kernel_outputs, kernel_node, body_outputs, body_node)``: the kernel
    and ``node.forward`` each on a deep copy of the (unapplied) node and on
    copies of the inputs; raises if either changed its inputs."""
    node_k, node_b = copy.deepcopy(node), copy.deepcopy(node)
    ins_k = tuple(_copy(a) for a in inputs)
    ins_b = tuple(_copy(a) for a in inputs)
    out_k = kernel(node_k, ins_k)
    out_b = node_b.forward(ins_b)
    for who, ins in (('the kernel', ins_k), ('the body', ins_b)):
        for i, (a, b) in enumerate(zip(ins, inputs)):
            if backend.is_array(a) and not numpy.array_equal(
                    backend.to_cpu(a), backend.to_cpu(b), equal_nan=True):
                raise AssertionError('{} of {} wrote into its input {}'
                                     .format(who, type(node).__name__, i))
    return out_k, node_k, out_b, node_b


def _close(what, got, want, atol, any_special=False):
    """Raise unless ``got`` equals ``want``: NaN and infinities at the same
    places (with ``any_special``, any of them where the body has one),
    finite values within ``atol``; with ``atol`` 0 the same bits (the sign
    of a zero included), where the op rounds nothing."""
    got, want = backend.to_cpu(got), backend.to_cpu(want)
    if got.shape != want.shape:
        raise AssertionError('{}: shape {} from the kernel, {} from the body'
                             .format(what, got.shape, want.shape))
    special = ~numpy.isfinite(want)
    if any_special:
        wrong = special != ~numpy.isfinite(got)
    else:
        wrong = (numpy.isnan(got) != numpy.isnan(want)) | (
            special & ~numpy.isnan(want) & (got != want))
    if wrong.any():
        at = tuple(int(i) for i in numpy.argwhere(wrong)[0])
        raise AssertionError('{}: {} where the body gives {} (at {}; {} '
                             'such places)'.format(what, got[at], want[at],
                                                   at, int(wrong.sum())))
    finite = ~special
    if atol == 0:
        wrong = finite & ((got != want)
                          | (numpy.signbit(got) != numpy.signbit(want)))
    else:
        wrong = finite & ~(numpy.abs(got.astype(numpy.float64) - want)
                           <= atol)
    if wrong.any():
        diff = numpy.where(wrong, numpy.abs(got.astype(numpy.float64)
                                            - want), 0)
        at = tuple(int(i) for i in numpy.argwhere(wrong)[
            int(numpy.argmax(diff[wrong]))])
        raise AssertionError(
            '{}: the kernel differs from the body by up to {:.3g} (at {}: '
            '{!r} for {!r}), tolerance {:.3g}'.format(
                what, float(diff[at]), at, got[at], want[at], atol))


def _same(a, b):
    """Equal values; plain objects (a Layout) by their attributes."""
    if hasattr(a, '__dict__') and type(a) is type(b) and not callable(a):
        return vars(a) == vars(b)
    return a == b


def assert_kernel_equals_body(kernel, node, inputs, atol=0.0,
                              attr_atol=None, hints=(), may_decline=False,
                              any_special=False):
    """Assert that ``kernel`` computes what ``node``'s body computes.

    Args:
        kernel: ``kernel(node, inputs)``, as registered.
        node: an unapplied node (its hyper-parameters set; copied, not used).
        inputs: the tuple of input arrays (copied).
        atol: absolute tolerance for the outputs; a number, or one per
            output.
        attr_atol: {attribute name: absolute tolerance} for the node's
            array attributes (default: ``atol`` of output 0); integer
            attributes (indexes) must be equal.
        hints: attributes that the kernels may set differently, as hints
            for the backward's kernels (e.g. batch normalization's
            ``centered``); their names are compared, not their values.
        may_decline: whether the kernel may decline these inputs.
        any_special: let the kernel give NaN where the body gives an
            infinity and the reverse (the same places must be finite):
            for kernels that compute by another formula, where ``inf -
            inf`` happens in one and not the other (batch
            normalization's ``x * scale + shift`` for ``(x - mean) *
            scale + beta``).
    Returns:
        ``(kernel_outputs, body_outputs)``; None when the kernel declined
        and ``may_decline``.
    Raises:
        AssertionError naming the node type and what differs; also when the
        kernel declines (returns None) these inputs unless ``may_decline``.
    """
    label = type(node).__name__
    out_k, node_k, out_b, node_b = run_both(kernel, node, inputs)
    if out_k is None and may_decline:
        return None
    if out_k is None:
        raise AssertionError('the kernel of {} declined inputs of shapes {}'
                             .format(label, [getattr(a, 'shape', None)
                                             for a in inputs]))
    if not isinstance(out_k, tuple) or len(out_k) != len(out_b):
        raise AssertionError('{}: the kernel returned {}, the body {} outputs'
                             .format(label, type(out_k).__name__, len(out_b)))
    atols = atol if isinstance(atol, (tuple, list)) else [atol] * len(out_b)
    for i, (k, b, tol) in enumerate(zip(out_k, out_b, atols)):
        if k.dtype != b.dtype:
            raise AssertionError('{} output {}: dtype {} from the kernel, {} '
                                 'from the body'.format(label, i, k.dtype,
                                                        b.dtype))
        _close('{} output {}'.format(label, i), k, b, tol, any_special)
    for name in ('_input_indexes_to_retain', '_output_indexes_to_retain'):
        if getattr(node_k, name) != getattr(node_b, name):
            raise AssertionError('{}: {} is {} after the kernel, {} after '
                                 'the body'.format(label, name,
                                                   getattr(node_k, name),
                                                   getattr(node_b, name)))
    attrs_k, attrs_b = vars(node_k), vars(node_b)
    if set(attrs_k) != set(attrs_b):
        raise AssertionError('{}: the kernel set attributes {}, the body {}'
                             .format(label, sorted(attrs_k), sorted(attrs_b)))
    attr_atol = attr_atol or {}
    for name in sorted(attrs_b):
        k, b = attrs_k[name], attrs_b[name]
        if name in hints or name.startswith('_'):
            continue
        if backend.is_array(b):
            integer = numpy.dtype(b.dtype).kind in 'iub'
            tol = 0 if integer else attr_atol.get(name, atols[0])
            _close('{}.{}'.format(label, name), k, b, tol, any_special)
        elif not _same(k, b):
            raise AssertionError('{}.{}: {!r} after the kernel, {!r} after '
                                 'the body'.format(label, name, k, b))
    return out_k, out_b


def assert_update_equals_body(kernel, rule, param, atol=0.0,
                              may_decline=False):
    """Assert that an update rule's kernel (``kernel(rule, param)``, as
    registered for the rule's type) updates ``param`` and the rule's state
    as ``rule.update_core(param)`` does, within ``atol``, and writes
    nothing into ``param.grad``. Each runs on a deep copy of ``rule`` and
    of ``param``'s arrays that keep their layouts (:func:`_copy`), handed
    over as a stand-in with ``array`` and ``grad``; the rule's state must
    exist (``rule.init_state(param)``).

    Returns:
        True, or False when the kernel declined and ``may_decline``.
    """
    label = type(rule).__name__
    runs = []
    for run in (kernel, lambda r, p: r.update_core(p) or True):
        r = copy.deepcopy(rule)
        p = types.SimpleNamespace(array=_copy(param.array),
                                  grad=_copy(param.grad))
        r.state = {k: _copy(v) for k, v in rule.state.items()}
        if not run(r, p):
            if may_decline:
                return False
            raise AssertionError('the kernel of {} declined'.format(label))
        if not numpy.array_equal(p.grad, param.grad, equal_nan=True):
            raise AssertionError('{}: the kernel wrote into the gradient'
                                 .format(label))
        runs.append((p.array, r.state))
    (pk, sk), (pb, sb) = runs
    _close('{}: the parameter'.format(label), pk, pb, atol)
    for name in sorted(sb):
        _close('{}: state {}'.format(label, name), sk[name], sb[name], atol)
    return True
