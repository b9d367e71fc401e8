"""The batch normalization layer: L.BatchNormalization."""
import contextlib
import copy
import numbers
import warnings

import numpy

from minichain import backend
from minichain import functions as F
from minichain import initializers
from minichain.configuration import config
from minichain.functions.normalization import then_add_relu
from minichain.functions._check import unwrap
from minichain.link import Link
from minichain.links import _mixed16
from minichain.variable import Parameter

__all__ = ['BatchNormalization']


@contextlib.contextmanager
def running_statistics_guard(link):
    """Around a training step of batch normalization ``link``: when the
    update made ``avg_mean`` or ``avg_var`` inf or NaN (an input holding NaN
    or inf), put them (and ``N``) back as they were and say so in a
    RuntimeWarning naming the layer, once per layer. Unchecked, one bad
    batch turned every later evaluation into NaN without a word. The step
    itself goes on: its output is not finite either, and what to do about
    that is the training loop's choice (the multi-node optimizer's NaN
    check stops it). The check costs one pass over two per-channel arrays
    (one synchronization on a GPU).
    """
    old = link.avg_mean.copy(), link.avg_var.copy(), link.N
    yield
    xp = backend.get_array_module(link.avg_mean)
    finite = xp.isfinite(link.avg_mean) & xp.isfinite(link.avg_var)
    if bool(finite.all()):
        return
    channel = int(backend.to_cpu(xp.flatnonzero(~finite))[0])
    mean = float(link.avg_mean.ravel()[channel])
    var = float(link.avg_var.ravel()[channel])
    link.avg_mean[...], link.avg_var[...], link.N = old
    if getattr(link, '_warned_not_finite', False):
        return
    link._warned_not_finite = True
    warnings.warn(
        '{} {!r}: the batch statistics are not finite (channel {}: mean {}, '
        'variance {}; {} of {} channels): the input holds NaN or inf; '
        'avg_mean and avg_var were left as they were (said once per '
        'layer)'.format(type(link).__name__, link.name, channel, mean, var,
                        int((~finite).sum()), finite.size),
        RuntimeWarning, stacklevel=4)


class BatchNormalization(Link):
    """Batch normalization with learned scale and shift and running
    statistics (``F.batch_normalization`` / ``F.fixed_batch_normalization``).

    In training (``minichain.config.train``) the layer normalizes with the
    batch statistics and folds them into ``avg_mean`` and ``avg_var``
    (``avg = decay * avg + (1 - decay) * batch``, the variance unbiased);
    otherwise it normalizes with ``avg_mean`` and ``avg_var``.

    Args:
        size: channel count (int) or channel shape (tuple); None infers it
            from the first input (lazy initialization).
        decay: weight of the old running statistics.
        eps: added to the variance.
        dtype: dtype of the parameters and running statistics.
        use_gamma, use_beta: learn the scale ``gamma`` (else fixed to 1),
            the shift ``beta`` (else fixed to 0).
        initial_gamma, initial_beta: initializer, scalar or array; default
            1 and 0.
        axis: reduced axes as in ``F.batch_normalization`` (None: every axis
            but 1).

    Attributes:
        gamma, beta: Parameters of the channel shape, or None.
        avg_mean, avg_var: running statistics (persistent; start at 0, 1).
        N: number of batches seen in ``finetune`` mode (persistent).

    Input ``(N, C, ...)``; output of the same shape.
    """

    def __init__(self, size=None, decay=0.9, eps=2e-5, dtype=numpy.float32,
                 use_gamma=True, use_beta=True, initial_gamma=None,
                 initial_beta=None, axis=None):
        super().__init__()
        self.decay, self.eps, self.axis = decay, eps, axis
        self._dtype = numpy.dtype(dtype)
        self.avg_mean = None
        self.avg_var = None
        self.N = 0
        for name in ('avg_mean', 'avg_var', 'N'):
            self.register_persistent(name)
        with self.init_scope():
            self.gamma = self._param(use_gamma, initial_gamma, 1)
            self.beta = self._param(use_beta, initial_beta, 0)
        if size is not None:
            self._initialize(
                (size,) if isinstance(size, numbers.Integral) else size)

    def _param(self, use, initial, default):
        if not use:
            return None
        init = initializers.get_initializer(
            initial, default=initializers.Constant(default, self._dtype),
            dtype=self._dtype)
        if isinstance(init, initializers.Initializer) and init.dtype is None:
            init = copy.copy(init)  # the caller's object stays untouched
            init.dtype = self._dtype
        return Parameter(init)

    def _initialize(self, shape):
        shape = tuple(int(s) for s in shape)
        for param in (self.gamma, self.beta):
            if param is not None and not param.is_initialized:
                param.initialize(shape)
        xp = self.xp
        self.avg_mean = xp.zeros(shape, dtype=self._dtype)
        self.avg_var = xp.ones(shape, dtype=self._dtype)

    def initialize_for(self, x):
        """Create gamma, beta and the running statistics for the channels
        of ``x`` unless they exist (a layer made with ``size=None``)."""
        if self.avg_mean is None:
            self._initialize(self._channel_shape(x))

    def _channel_shape(self, x):
        if self.axis is None:
            return x.shape[1:2]
        axes = (self.axis,) if isinstance(self.axis, int) else self.axis
        axes = [a % x.ndim for a in axes]
        return tuple(s for i, s in enumerate(x.shape) if i not in axes)

    def forward(self, x, finetune=False, residual=None, relu=False):
        """Normalize ``x``.

        Args:
            x: Variable or array ``(N, C, ...)``.
            finetune: in training, accumulate the statistics as a plain
                average over all batches seen (``decay = 1 - 1 / N``, with
                ``N`` counting calls) instead of an exponential one.
            residual, relu: return ``relu(bn(x) + residual)`` instead (each
                part when given; not in Chainer), fused in training (see
                ``F.batch_normalization``).
        Returns:
            Variable shaped like x, of x's dtype. Under mixed16 a 16-bit x
            is normalized with float32 statistics and parameters: in
            training by ``F.batch_normalization`` itself, in inference in
            float32 and handed back in x's type.
        """
        if (_mixed16.on() and unwrap(x).dtype.itemsize < 4
                and not config.train):
            return _mixed16.in_float32(x, lambda x32: self.forward(
                x32, finetune, None if residual is None else
                F.cast(residual, 'float32'), relu))
        self.initialize_for(x)
        xp = self.xp
        shape = self.avg_mean.shape
        gamma = self.gamma if self.gamma is not None else xp.ones(
            shape, dtype=self._dtype)
        beta = self.beta if self.beta is not None else xp.zeros(
            shape, dtype=self._dtype)
        if config.train:
            with running_statistics_guard(self):
                if finetune:
                    self.N += 1
                    decay = 1.0 - 1.0 / self.N
                else:
                    decay = self.decay
                return F.batch_normalization(
                    x, gamma, beta, eps=self.eps, running_mean=self.avg_mean,
                    running_var=self.avg_var, decay=decay, axis=self.axis,
                    residual=residual, relu=relu)
        y = F.fixed_batch_normalization(x, gamma, beta, self.avg_mean,
                                        self.avg_var, eps=self.eps,
                                        axis=self.axis)
        return then_add_relu(y, residual, relu)

    def _repr_args(self):
        size = None if self.avg_mean is None else self.avg_mean.shape
        return 'size={}, decay={}, eps={}'.format(size, self.decay, self.eps)
