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

import numpy

from minichain import backend

__all__ = ['assert_kernel_equals_body', 'sum_tolerance', 'run_both']


def sum_tolerance(n_terms, max_term, dtype, factor=8.0):
    """How far two orders of summing ``n_terms`` terms of magnitude at most
    ``max_term`` may differ in ``dtype``: ``factor * sqrt(n) * eps *
    max_term`` (rounding errors of a sum grow like the square root of the
    number of terms when they are independent; ``factor`` covers the
    distribution's tail and the final rounding of each partial sum)."""
    eps = float(numpy.finfo(dtype).eps)
    return factor * math.sqrt(max(1, n_terms)) * eps * float(max_term)


def _copy(a):
    """A copy with the same memory layout (a channel-major array stays
    channel-major): kernels take other routes for other layouts."""
    if a is None or not backend.is_array(a):
        return copy.deepcopy(a)
    xp = backend.get_array_module(a)
    return a.copy(order='K') if xp is numpy else a.copy()


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


def _close(what, got, want, atol):
    got, want = backend.to_cpu(got), backend.to_cpu(want)
    if got.shape != want.shape:
        raise AssertionError('{}: shape {} from the kernel, {} from the body'
                             .format(what, got.shape, want.shape))
    if atol == 0:
        ok = numpy.array_equal(got, want, equal_nan=True)
    else:
        ok = numpy.allclose(got, want, rtol=0, atol=atol, equal_nan=True)
    if not ok:
        diff = numpy.abs(got.astype(numpy.float64) - want)
        raise AssertionError(
            '{}: the kernel differs from the body by up to {:.3g} (at {}), '
            'tolerance {:.3g}'.format(what, numpy.nanmax(diff),
                                      numpy.unravel_index(
                                          numpy.nanargmax(diff), diff.shape),
                                      atol))


def _same(a, b):
    """Equal values; plain objects (a Layout) by their attributes."""
    if hasattr(a, '__dict__') and type(a) is type(b) and not callable(a):
        return vars(a) == vars(b)
    return a == b


def assert_kernel_equals_body(kernel, node, inputs, atol=0.0,
                              attr_atol=None, hints=()):
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
    Returns:
        ``(kernel_outputs, body_outputs)``.
    Raises:
        AssertionError naming the node type and what differs; also when the
        kernel declines (returns None) these inputs.
    """
    label = type(node).__name__
    out_k, node_k, out_b, node_b = run_both(kernel, node, inputs)
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
        _close('{} output {}'.format(label, i), k, b, tol)
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
            _close('{}.{}'.format(label, name), k, b, tol)
        elif not _same(k, b):
            raise AssertionError('{}.{}: {!r} after the kernel, {!r} after '
                                 'the body'.format(label, name, k, b))
    return out_k, out_b
