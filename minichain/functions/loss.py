"""Losses: softmax_cross_entropy, mean_squared_error and squared_error."""
import contextlib
import math

import numpy

from minichain import backend
from minichain.configuration import config
from minichain.function_node import FunctionNode
from minichain.functions import activation as _activation
from minichain.functions import array as _array
from minichain.functions._check import check_float, check_same_dtype, unwrap

__all__ = ['softmax_cross_entropy', 'mean_squared_error', 'squared_error',
           'squared_difference']


def _sum_dtype(dtype):
    """The dtype a loss is summed in: float32 for float16 inputs, whose own
    sum is inf past 65504 (4096 samples at a loss of 16), and bfloat16's,
    whose 8 bits would round the sum; else their own."""
    return ('float32' if backend.is_float(dtype) and dtype.itemsize < 4
            else dtype)


def _shifted(x):
    """``x - max(x)`` along axis 1, where a row whose max is infinite takes
    its limit: with ``+inf`` logits, those share the probability (0 there,
    ``-inf`` elsewhere); with every logit ``-inf``, all are equal (0).
    ``x - max`` would be NaN there (``inf - inf``). Also the mask of the
    rows that are finite."""
    xp = backend.get_array_module(x)
    m = x.max(axis=1, keepdims=True)
    infinite = xp.isinf(m)
    limit = xp.where(x == m, 0, -math.inf).astype(x.dtype, copy=False)
    quiet = getattr(xp, 'errstate', None)  # inf - inf: replaced by limit
    with quiet(invalid='ignore') if quiet else contextlib.nullcontext():
        return xp.where(infinite, limit, x - m), ~infinite


class ShiftedLogits(FunctionNode):
    """``x -> x - max(x)`` along axis 1, with the limits of :func:`_shifted`
    for rows holding infinities. The max counts as a constant: softmax does
    not depend on a shift, so its gradient is unchanged; rows with infinite
    logits get no gradient (their limit does not move with x)."""

    def forward(self, inputs):
        z, finite = _shifted(inputs[0])
        self.finite = finite
        return z,

    def backward(self, indexes, grad_outputs):
        gz, = grad_outputs
        return gz * self.finite.astype(gz.dtype),


class SoftmaxCrossEntropy(FunctionNode):
    """Fused log-softmax + negative log-likelihood over axis 1.

    Inputs ``(x, t)``: logits (N, C, ...) and integer labels (N, ...).
    """

    def __init__(self, ignore_label, reduce):
        self.ignore_label, self.reduce = ignore_label, reduce

    def forward(self, inputs):
        self.retain_inputs((0, 1))
        x, t = inputs
        xp = backend.get_array_module(x)
        z, _ = _shifted(x)
        log_y = z - xp.log(xp.exp(z).sum(axis=1, keepdims=True))
        valid = t != self.ignore_label
        t_safe = xp.where(valid, t, 0)
        picked = xp.take_along_axis(log_y, xp.expand_dims(t_safe, 1), axis=1)
        loss = xp.where(valid, -picked.squeeze(1), 0)
        if self.reduce == 'no':
            return loss.astype(x.dtype, copy=False),
        total = loss.sum(dtype=_sum_dtype(x.dtype))
        return xp.asarray(total * self._coeff(valid), dtype=x.dtype),

    def _coeff(self, valid):
        # 1 / (number of non-ignored labels), left on the device; an empty
        # batch gives a zero loss rather than a division by zero.
        xp = backend.get_array_module(valid)
        return 1.0 / xp.maximum(valid.sum(), 1)

    def backward(self, indexes, grad_outputs):
        x, t = self.get_retained_inputs()
        if 0 not in indexes:
            return tuple(None for _ in indexes)
        xp = x.xp
        ta = t.array
        valid = ta != self.ignore_label
        # (softmax(x) - onehot(t)) * weight; softmax as a function keeps
        # the gradient differentiable in x, and the weight makes it so in gy.
        onehot = (xp.arange(x.shape[1]).reshape(
            (1, -1) + (1,) * (x.ndim - 2)) == xp.expand_dims(ta, 1))
        weight = xp.expand_dims(valid, 1).astype(x.dtype)
        gy, = grad_outputs
        if self.reduce == 'no':
            gy = _array.expand_dims(gy, 1)
        else:
            weight = weight * self._coeff(valid).astype(x.dtype)
        diff = _activation.softmax(ShiftedLogits().apply((x,))[0], axis=1) \
            - onehot.astype(x.dtype)
        gx = diff * weight * gy
        return tuple(gx if i == 0 else None for i in indexes)


def softmax_cross_entropy(x, t, ignore_label=-1, reduce='mean'):
    """Cross entropy between ``softmax(x)`` along axis 1 and integer labels.

    ``loss_n = -log(softmax(x)[n, t_n])`` for each sample (and each spatial
    position when ``x`` has more than two axes); labels equal to
    ``ignore_label`` contribute nothing.

    Infinite logits give the limits: with ``+inf`` logits in a row, those
    classes share the probability equally (``[inf, 0, 0]`` with label 0
    costs 0, with label 1 ``inf``; ``[inf, inf, 0]`` with label 0 costs
    ``log 2``), and a row of ``-inf`` logits is uniform (cost ``log C``);
    the gradient of such a row is ``softmax - onehot`` at the limit, finite.
    NaN logits give NaN.

    Args:
        x: float logits of shape (N, C) or (N, C, d1, d2, ...).
        t: integer labels of shape (N,) or (N, d1, d2, ...), each in
            ``[0, C)`` or equal to ``ignore_label``.
        ignore_label: the label value to skip.
        reduce: ``'mean'`` averages over the non-ignored labels (a scalar;
            zero when every label is ignored); ``'no'`` returns the
            per-sample loss of ``t``'s shape (zero at ignored labels).
    Returns:
        Variable of shape () or ``t.shape``, dtype of ``x``.
    Raises:
        TypeError: non-float ``x`` or non-integer ``t``.
        ValueError: mismatched shapes, an unknown ``reduce``, or a label
            outside ``[0, C)`` that is not ``ignore_label``. The label check
            needs the label values on the host: it always runs for NumPy
            labels, but for CuPy labels only in debug mode
            (``minichain.config.debug``), so that a training step on the GPU
            never waits for the device. Without it an out-of-range label on
            the GPU gives an undefined loss and gradient.
    """
    name = 'softmax_cross_entropy'
    xa, ta = check_float(name, x, 'x'), unwrap(t)
    if not backend.is_array(ta) or ta.dtype.kind not in 'iu':
        raise TypeError('{}: t must be an integer array, got {}'.format(
            name, getattr(ta, 'dtype', type(ta).__name__)))
    if reduce not in ('mean', 'no'):
        raise ValueError("{}: reduce must be 'mean' or 'no', got {!r}"
                         .format(name, reduce))
    if xa.ndim < 2 or ta.shape != xa.shape[:1] + xa.shape[2:]:
        raise ValueError(
            '{}: x of shape {} (N, C, ...) needs t of shape (N, ...) = {}, '
            'got t of shape {}'.format(
                name, xa.shape, xa.shape[:1] + xa.shape[2:] if xa.ndim >= 2
                else '(undefined)', ta.shape))
    # Reading a value back from the GPU waits for every queued kernel, so
    # on CuPy the range check runs in debug mode only (as Chainer's checks
    # of input values do); on NumPy it is free and always runs.
    if backend.get_array_module(ta) is numpy or config.debug:
        _check_label_range(name, xa, ta, ignore_label)
    return SoftmaxCrossEntropy(ignore_label, reduce).apply((x, t))[0]


def _check_label_range(name, xa, ta, ignore_label):
    """Raise ValueError naming the first label outside ``[0, C)`` that is
    not ``ignore_label`` (a device sync when ``ta`` lives on the GPU)."""
    n_class = xa.shape[1]
    bad = ((ta < 0) | (ta >= n_class)) & (ta != ignore_label)
    if ta.size and bool(bad.any()):
        first = backend.to_cpu(ta[bad]).ravel()[0]
        raise ValueError(
            '{}: label {} is out of range [0, {}) for x of shape {} '
            '(ignore_label={})'.format(name, int(first), n_class, xa.shape,
                                       ignore_label))


class MeanSquaredError(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0, 1))
        x0, x1 = inputs
        xp = backend.get_array_module(x0)
        diff = x0 - x1
        total = (diff * diff).sum(dtype=_sum_dtype(x0.dtype))
        return xp.asarray(total / diff.size, dtype=x0.dtype),

    def backward(self, indexes, grad_outputs):
        x0, x1 = self.get_retained_inputs()
        gy, = grad_outputs
        g0 = gy * (x0 - x1) * (2.0 / x0.size)
        return tuple(g0 if i == 0 else -g0 for i in indexes)


def mean_squared_error(x0, x1):
    """Mean of squared differences, ``sum((x0 - x1) ** 2) / x0.size``.

    Args:
        x0, x1: float Variables or ndarrays of one shape and dtype.
    Returns:
        Variable of shape () with the dtype of the inputs.
    """
    name = 'mean_squared_error'
    a = _check_pair(name, x0, x1)
    if a.size == 0:
        raise ValueError('{}: inputs are empty (shape {})'
                         .format(name, a.shape))
    return MeanSquaredError().apply((x0, x1))[0]


def _check_pair(name, x0, x1):
    """Raise unless ``x0`` and ``x1`` are float arrays of one shape and
    dtype; returns ``x0``'s array."""
    a, b = check_float(name, x0, 'x0'), check_float(name, x1, 'x1')
    check_same_dtype(name, a, b)
    if a.shape != b.shape:
        raise ValueError('{}: x0 and x1 must have one shape, got {} and {}'
                         .format(name, a.shape, b.shape))
    return a


class SquaredError(FunctionNode):
    def forward(self, inputs):
        self.retain_inputs((0, 1))
        x0, x1 = inputs
        diff = x0 - x1
        return backend.get_array_module(x0).asarray(diff * diff),

    def backward(self, indexes, grad_outputs):
        x0, x1 = self.get_retained_inputs()
        g0 = grad_outputs[0] * (x0 - x1) * 2.0
        return tuple(g0 if i == 0 else -g0 for i in indexes)


def squared_error(x0, x1):
    """Elementwise squared difference, ``(x0 - x1) ** 2``, not halved and
    not reduced (Chainer's ``F.squared_error``; reduce it yourself, e.g.
    ``F.mean(F.squared_error(y, t))`` is :func:`mean_squared_error`).

    Args:
        x0, x1: float Variables or ndarrays of one shape and dtype.
    Returns:
        Variable of that shape and dtype.
    """
    _check_pair('squared_error', x0, x1)
    return SquaredError().apply((x0, x1))[0]


def squared_difference(x1, x2):
    """:func:`squared_error` under Chainer's other name (and argument
    names)."""
    return squared_error(x1, x2)
