"""Normalization: batch_normalization, fixed_batch_normalization.

The training op is fused: one FunctionNode computes the statistics and the
output, and its backward is a second fused node, ``BatchNormalizationGrad``,
whose own backward is written with F functions (so any order of derivative
works). ``_batch_normalization_composite`` is the same math built only from
F functions; the tests hold the two together. The bodies below are the
textbook formulas; the kernels registered for these nodes
(``minichain/kernels``) compute the same in fewer passes over memory.
"""
from minichain import backend
from minichain.function_node import FunctionNode
from minichain.variable import as_variable
from minichain.functions.channel_layout import Layout, acc_dtype
from minichain.functions._check import (check_array, check_float,
                                        check_same_dtype, normalize_axis,
                                        unwrap)
from minichain.functions.activation import ReLUGrad
from minichain.functions.activation import relu as _relu
from minichain.functions.array import broadcast_to, cast, reshape
from minichain.functions.reduction import sum as _sum

__all__ = ['batch_normalization', 'fixed_batch_normalization']


def _layout(func_name, x, gamma, axis, others=(), mixed=False):
    """Validate x, gamma (and beta, ...), Variables or arrays, and return
    their Layout. ``mixed``: a 16-bit x may have float32 parameters."""
    x = check_float(func_name, x, 'x')
    gamma = check_array(func_name, gamma, 'gamma')
    others = tuple((what, check_array(func_name, a, what))
                   for what, a in others)
    check_same_dtype(func_name, gamma, *(a for _, a in others))
    if not (mixed and acc_dtype(x.dtype) == gamma.dtype):
        check_same_dtype(func_name, x, gamma)
    if x.ndim < 2:
        raise ValueError('{}: x must have at least 2 axes (batch, channel, '
                         '...), got shape {}'.format(func_name, x.shape))
    if axis is None:
        if gamma.ndim < 1 or gamma.ndim >= x.ndim:
            raise ValueError('{}: gamma of shape {} cannot describe the '
                             'channels of x of shape {}'.format(
                                 func_name, gamma.shape, x.shape))
        axes = (0,) + tuple(range(1 + gamma.ndim, x.ndim))
    else:
        axes = normalize_axis(func_name, axis, x.ndim)
        if len(axes) == x.ndim:
            raise ValueError('{}: axis {} reduces every axis of x of shape '
                             '{}; at least one channel axis must remain'
                             .format(func_name, axis, x.shape))
    lay = Layout(x.shape, axes)
    for what, a in (('gamma', gamma),) + others:
        if a.shape != lay.cshape:
            raise ValueError(
                '{}: {} has shape {} but x of shape {} has channel shape {} '
                '(reduced axes {})'.format(func_name, what, a.shape, x.shape,
                                           lay.cshape, axes))
    return lay


# -- composite pieces (F functions only) --------------------------------------
def _normalize_composite(x, lay, eps):
    """``(x_hat, inv_std)`` as Variables: ``x_hat`` shaped like x,
    ``inv_std = (var + eps) ** -0.5`` of shape ``lay.bshape``."""
    x = as_variable(x)
    inv_m = 1.0 / lay.m
    mu = _sum(x, axis=lay.axes, keepdims=True) * inv_m
    xc = x - broadcast_to(mu, lay.shape)
    var = _sum(xc * xc, axis=lay.axes, keepdims=True) * inv_m
    inv_std = (var + eps) ** -0.5
    return xc * broadcast_to(inv_std, lay.shape), inv_std


def _batch_normalization_composite(x, gamma, beta, eps=2e-5, axis=None,
                                   residual=None, relu=False):
    """Reference training-mode batch normalization made of F functions only
    (sum, sub, mul, pow, broadcast_to, reshape, then add and relu); same
    arguments and result as :func:`batch_normalization` without the
    running statistics."""
    lay = _layout('batch_normalization', x, gamma, axis, (('beta', beta),))
    x_hat, _ = _normalize_composite(x, lay, eps)
    y = (x_hat * broadcast_to(reshape(gamma, lay.bshape), lay.shape)
         + broadcast_to(reshape(beta, lay.bshape), lay.shape))
    return then_add_relu(y, residual, relu)


def then_add_relu(y, residual=None, relu=False):
    """``relu(y + residual)`` as separate ops (each part only when asked):
    what ``batch_normalization(..., residual=, relu=)`` fuses, for the
    paths that do not (inference, multi-node statistics)."""
    if residual is not None:
        y = y + residual
    return _relu(y) if relu else y


def _fixed_batch_normalization_composite(x, gamma, beta, mean, var,
                                         eps=2e-5, axis=None):
    """Reference inference-mode batch normalization made of F functions."""
    lay = _layout('fixed_batch_normalization', x, gamma, axis,
                  (('beta', beta), ('mean', mean), ('var', var)))

    def b(v):
        return broadcast_to(reshape(v, lay.bshape), lay.shape)
    inv_std = (as_variable(var) + eps) ** -0.5
    return (x - b(mean)) * b(gamma * inv_std) + b(beta)


# -- training mode ------------------------------------------------------------
class BatchNormalization(FunctionNode):
    """Inputs ``(x, gamma, beta)`` or ``(x, gamma, beta, residual)``; the
    output is ``relu(bn(x) + residual)`` with ``relu`` (each part when
    asked), in one pass where the kernel can."""

    def __init__(self, lay, eps, running_mean, running_var, decay,
                 relu=False):
        self.lay, self.eps, self.decay = lay, eps, decay
        self.running_mean, self.running_var = running_mean, running_var
        self.relu = relu

    def forward(self, inputs):
        x, gamma, beta = inputs[:3]
        residual = inputs[3] if len(inputs) == 4 else None
        xp = backend.get_array_module(x)
        lay = self.lay
        # float16 is normalized in float32, and its statistics stay float32.
        acc = acc_dtype(x.dtype)
        xa = x.astype(acc, copy=False)
        mean = xa.mean(axis=lay.axes)
        xc = xa - mean.reshape(lay.bshape)
        var = (xc * xc).mean(axis=lay.axes)
        inv_std = 1 / xp.sqrt(var + acc.type(self.eps))
        scale = (gamma.astype(acc) * inv_std).reshape(lay.bshape)
        y = (xc * scale + beta.astype(acc).reshape(lay.bshape)).astype(
            x.dtype, copy=False)
        if residual is not None:
            y = y + residual
        if self.relu:
            y = xp.maximum(y, y.dtype.type(0))
        self.keep_statistics(mean, var, inv_std, True)
        return y,

    def keep_statistics(self, mean, var, inv_std, centered, running=True,
                        relu_workspace=None):
        """What backward keeps, and the running averages: called by the
        body and by every kernel of this node.

        Args:
            mean, var, inv_std: the batch's statistics, of the channel
                shape (``var`` biased, ``inv_std = (var + eps) ** -0.5``).
            centered: a hint for BatchNormalizationGrad's kernels: whether
                the forward needed ``x - mean`` for an accurate variance
                (True is always safe; the body ignores it).
            running: False when the kernel already updated the running
                averages (in the launch that computed the statistics).
            relu_workspace: a hint for BatchNormalizationGrad's kernels:
                relu's mask (``y > 0``) in the form the kernel's fused
                relu wrote it, or None (the body's: backward reads y).
        """
        self.retain_inputs((0, 1))
        if self.relu:
            self.retain_outputs((0,))  # its sign is relu's mask
        # Channel-sized statistics kept for backward: they save a reduction
        # pass over x. x_hat (as big as x) is not kept; backward folds it
        # into its formula at the cost of at most one elementwise pass.
        self.mean, self.inv_std, self.centered = mean, inv_std, centered
        self.relu_workspace = relu_workspace
        if running and self.running_mean is not None:
            d = self.decay
            self.running_mean[...] = d * self.running_mean + (1 - d) * mean
        if running and self.running_var is not None:
            d, m = self.decay, self.lay.m
            self.running_var[...] = (d * self.running_var
                                     + (1 - d) * m / (m - 1) * var)

    def backward(self, indexes, grad_outputs):
        x, gamma = self.get_retained_inputs()
        gy, = grad_outputs
        mask = ()  # (y,): BatchNormalizationGrad masks gy, a pass less
        if self.relu:
            y, = self.get_retained_outputs()
            if len(self.inputs) == 4:  # the masked gy is the residual's too
                gy = ReLUGrad().apply((y, gy))[0]
            else:
                mask = (y,)
        grads = (None,) * 3
        if min(indexes) < 3:
            grads = BatchNormalizationGrad(
                self.lay, self.eps, self.mean, self.inv_std, self.centered,
                self.relu_workspace).apply((x, gamma, gy) + mask)
        grads += (gy,)  # the residual's gradient
        return tuple(grads[i] for i in indexes)


class BatchNormalizationGrad(FunctionNode):
    """``(x, gamma, gy) -> (gx, ggamma, gbeta)``, fused; differentiable.
    A fourth input ``y`` (a forward's output after relu) masks gy first,
    as ``ReLUGrad`` would; ``relu_workspace``: see ``keep_statistics``."""

    def __init__(self, lay, eps, mean, inv_std, centered,
                 relu_workspace=None):
        self.lay, self.eps = lay, eps
        self.mean, self.inv_std, self.centered = mean, inv_std, centered
        self.relu_workspace = relu_workspace

    @staticmethod
    def masked(inputs):
        """``(x, gamma, gy)``, gy masked when ``inputs`` hold y (for the
        kernels that have no mask of their own)."""
        x, gamma, gy = inputs[:3]
        if len(inputs) == 4:
            gy = gy * (inputs[3] > 0)  # ReLUGrad's body
        return x, gamma, gy

    def forward(self, inputs):
        self.retain_inputs(tuple(range(len(inputs))))
        x, gamma, gy = self.masked(inputs)
        lay = self.lay
        acc = acc_dtype(x.dtype)
        gya = gy.astype(acc, copy=False)
        x_hat = ((x.astype(acc, copy=False) - self.mean.reshape(lay.bshape))
                 * self.inv_std.reshape(lay.bshape))
        gbeta = gya.sum(axis=lay.axes)
        ggamma = (gya * x_hat).sum(axis=lay.axes)
        # gx = gamma * inv_std * (gy - mean(gy) - x_hat * mean(gy * x_hat))
        a = (gamma.astype(acc) * self.inv_std).reshape(lay.bshape)
        gx = a * (gya - (gbeta / lay.m).reshape(lay.bshape)
                  - x_hat * (ggamma / lay.m).reshape(lay.bshape))
        return (gx.astype(x.dtype, copy=False),
                ggamma.astype(gamma.dtype, copy=False),
                gbeta.astype(gamma.dtype, copy=False))

    def backward(self, indexes, grad_outputs):
        # With P(v) = v - mean(v) - x_hat * mean(x_hat * v) (means per
        # channel) the first-order gradients are gx = gamma * inv_std *
        # P(gy), ggamma = sum(gy * x_hat), gbeta = sum(gy); this
        # differentiates those. x_hat and inv_std are rebuilt from x with F
        # functions so that the result is itself differentiable.
        x, gamma, gy, *y = self.get_retained_inputs()
        if y:  # relu's mask: a step function of y, whose gradient is None
            gy = ReLUGrad().apply((y[0], gy))[0]
        ggx, gggamma, ggbeta = grad_outputs
        low = x.dtype if x.dtype != gamma.dtype else None
        if low is not None:   # mixed16: in the parameters' float32
            x, gy, ggx = (None if v is None else cast(v, gamma.dtype)
                          for v in (x, gy, ggx))
        lay = self.lay
        x_hat, inv_std = _normalize_composite(x, lay, self.eps)

        def b(v):
            return broadcast_to(v, lay.shape)

        def mean(v):
            return _sum(v, axis=lay.axes, keepdims=True) * (1.0 / lay.m)

        def proj(v):
            return v - b(mean(v)) - x_hat * b(mean(x_hat * v))

        g = reshape(gamma, lay.bshape)
        g_gy = g_xhat = g_gamma = g_x = None
        if ggx is not None:
            a = b(g * inv_std)
            g_gy = a * proj(ggx)
            mgy, mgyx = mean(gy), mean(gy * x_hat)
            mggx = mean(ggx * x_hat)
            t = mean(ggx * gy) - mean(ggx) * mgy - mggx * mgyx
            g_gamma = reshape(inv_std * t * float(lay.m), gamma.shape)
            g_xhat = -a * (b(mgyx) * ggx + b(mggx) * gy)
            g_x = -(b(g * t * inv_std * inv_std) * x_hat)
        if gggamma is not None:
            gg = b(reshape(gggamma, lay.bshape))
            g_gy = _add(g_gy, gg * x_hat)
            g_xhat = _add(g_xhat, gg * gy)
        if ggbeta is not None:
            g_gy = _add(g_gy, b(reshape(ggbeta, lay.bshape)))
        if g_xhat is not None:
            g_x = _add(g_x, b(inv_std) * proj(g_xhat))
        if low is not None:
            g_x, g_gy = (None if v is None else cast(v, low)
                         for v in (g_x, g_gy))
        if y and g_gy is not None and 2 in indexes:
            g_gy = ReLUGrad().apply((y[0], g_gy))[0]
        result = {0: g_x, 1: g_gamma, 2: g_gy, 3: None}
        return tuple(result[i] for i in indexes)


def _add(acc, v):
    return v if acc is None else acc + v


def batch_normalization(x, gamma, beta, eps=2e-5, running_mean=None,
                        running_var=None, decay=0.9, axis=None,
                        residual=None, relu=False):
    """Batch normalization with batch statistics (training mode).

    ``y = gamma * (x - mean) / sqrt(var + eps) + beta``, where ``mean`` and
    ``var`` (biased) are taken per channel over the reduced axes.

    ``residual`` and ``relu`` (not in Chainer) end a ResNet block in the
    same op: the result is ``relu(y + residual)``, each part when asked,
    equal to those separate ops (:func:`then_add_relu`) but computed while
    y is still in cache, without their two passes over memory.

    Args:
        x: Variable or array ``(N, C, ...)`` (e.g. ``(N, C)`` or
            ``(N, C, H, W)``), floating point.
        gamma, beta: scale and shift of the channel shape (``(C,)`` for the
            default axis), x's dtype, or float32 for a 16-bit x (Chainer's
            mixed16: the statistics are float32 either way).
        eps: added to the variance.
        running_mean, running_var: arrays of the channel shape updated IN
            PLACE as ``r = decay * r + (1 - decay) * s``, with ``s`` the batch
            mean, resp. the unbiased batch variance ``var * m / (m - 1)``.
        decay: weight of the old running value.
        axis: axes to reduce (int or tuple). None: axis 0 and every axis
            after the channel axes, i.e. all but axis 1 for a 1-D gamma.
        residual: Variable or array of x's shape and dtype added to the
            output (a ResNet block's shortcut), or None.
        relu: apply ``max(., 0)`` last.
    Returns:
        Variable shaped like x.
    Raises:
        ValueError: x has fewer than 2 axes, gamma/beta/running shapes do
            not match the channels, a channel has fewer than 2 elements
            (the variance is undefined), or residual is not x's shape.
        TypeError: non-float x, or x, gamma, beta (and residual) differ in
            dtype (but float32 parameters for a 16-bit x).
    """
    name = 'batch_normalization'
    xa = unwrap(x)
    lay = _layout(name, x, gamma, axis, (('beta', beta),), mixed=True)
    inputs = (x, gamma, beta)
    if residual is not None:
        ra = check_array(name, residual, 'residual')
        check_same_dtype(name, xa, ra)
        if ra.shape != xa.shape:
            raise ValueError('{}: residual has shape {} but x has shape {}'
                             .format(name, ra.shape, xa.shape))
        inputs += (residual,)
    if lay.m < 2:
        raise ValueError('{}: x of shape {} has {} element(s) per channel '
                         '(reduced axes {}); training-mode statistics need '
                         'at least 2'.format(name, xa.shape, lay.m, lay.axes))
    stats = []
    for what, r in (('running_mean', running_mean),
                    ('running_var', running_var)):
        r = unwrap(r)
        if r is not None:
            check_array(name, r, what)
            if r.shape != lay.cshape:
                raise ValueError('{}: {} has shape {} but the channel shape '
                                 'is {}'.format(name, what, r.shape,
                                                lay.cshape))
        stats.append(r)
    return BatchNormalization(lay, eps, stats[0], stats[1], decay,
                              bool(relu)).apply(inputs)[0]


# -- inference mode -----------------------------------------------------------
class FixedBatchNormalization(FunctionNode):
    def __init__(self, lay, eps):
        self.lay, self.eps = lay, eps

    def forward(self, inputs):
        self.retain_inputs((0, 1, 3, 4))
        x, gamma, beta, mean, var = inputs
        xp = backend.get_array_module(x)
        scale = gamma / xp.sqrt(var + self.eps)

        def b(v):
            return v.reshape(self.lay.bshape)
        return (x - b(mean)) * b(scale) + b(beta),

    def backward(self, indexes, grad_outputs):
        x, gamma, mean, var = self.get_retained_inputs()
        gy, = grad_outputs
        lay = self.lay
        inv_std = (var + self.eps) ** -0.5
        scale = gamma * inv_std

        def b(v):
            return broadcast_to(reshape(v, lay.bshape), lay.shape)

        def csum(v):
            return _sum(v, axis=lay.axes)
        result = {}
        if 0 in indexes:
            result[0] = gy * b(scale)
        if 2 in indexes or 3 in indexes:
            gbeta = csum(gy)
            result[2], result[3] = gbeta, -scale * gbeta
        if 1 in indexes or 4 in indexes:
            ggamma = csum(gy * ((x - b(mean)) * b(inv_std)))
            result[1] = ggamma
            result[4] = -0.5 * gamma * inv_std * inv_std * ggamma
        return tuple(result[i] for i in indexes)


def fixed_batch_normalization(x, gamma, beta, mean, var, eps=2e-5,
                              axis=None):
    """Batch normalization with given statistics (inference mode).

    ``y = gamma * (x - mean) / sqrt(var + eps) + beta``; differentiable with
    respect to all five inputs.

    Args:
        x: Variable or array ``(N, C, ...)``, floating point.
        gamma, beta, mean, var: Variables or arrays of the channel shape
            (``(C,)`` for the default axis), same dtype as x.
        eps: added to the variance.
        axis: reduced axes, as in :func:`batch_normalization`.
    Returns:
        Variable shaped like x.
    Raises:
        ValueError / TypeError as :func:`batch_normalization`.
    """
    lay = _layout('fixed_batch_normalization', x, gamma, axis,
                  (('beta', beta), ('mean', mean), ('var', var)))
    return FixedBatchNormalization(lay, eps).apply(
        (x, gamma, beta, mean, var))[0]
