"""Loss scaling, as Chainer v7's ``optimizer.loss_scaling()``.

float16 gradients below 6e-8 are zero: mixed precision (``config.dtype =
'mixed16'``) scales the loss by S before backward, so that every gradient
is S times larger while it is 16-bit, and the update divides by S again
(in float32, the parameters' precision). S must not be so large that a
gradient overflows to inf: dynamic scaling finds the largest S that works
by trying. An update whose gradients hold inf or NaN is skipped and halves
S; each clean update multiplies S by ``2 ** (1 / interval)``, so that S
doubles over ``interval`` clean updates (before the first overflow it
doubles at every update, as Chainer's). S stays within [1, 65504].

Under data parallelism no message is added: the gradients are averaged
before the check, and an inf or NaN on any rank is one in the average on
every rank, so every rank skips the same update and halves the same S
(``minichain.dist.create_multi_node_optimizer``).
"""
import math
import warnings

from minichain import backend


class LossScaling:
    """The loss scale of an optimizer (a mixin of ``Optimizer``)."""

    _loss_scale = None          # None: no scaling
    _loss_scale_max = 65504.0   # float16's largest value, as Chainer's
    _loss_scaling_is_dynamic = False
    _loss_scaling_isnan = False

    def loss_scaling(self, interval=1000, scale=None):
        """Scale the loss: dynamically (``scale`` None, starting at 1 and
        doubling over ``interval`` clean updates) or by ``scale``."""
        if scale is None:
            if interval < 1:
                raise ValueError('{}.loss_scaling: interval must be >= 1, '
                                 'got {}'.format(type(self).__name__,
                                                 interval))
            self._loss_scaling_is_dynamic = True
            self._loss_scale = 1.0
            self._loss_scaling_multiplier = 2.0 ** (1.0 / interval)
            self._loss_scaling_isnan_ever = False
        else:
            if not scale > 0 or not math.isfinite(scale):
                raise ValueError('{}.loss_scaling: scale must be a positive '
                                 'number, got {}'.format(
                                     type(self).__name__, scale))
            self._loss_scaling_is_dynamic = False
            self._loss_scale = float(scale)

    def set_loss_scale(self, loss_scale):
        """A static loss scale (``loss_scaling(scale=loss_scale)``)."""
        self.loss_scaling(scale=loss_scale)

    @property
    def dynamic_loss_scaling(self):
        """Whether an update with inf or NaN in its gradients is skipped
        (``loss_scaling()`` without a scale)."""
        return self._loss_scaling_is_dynamic

    @property
    def loss_scale(self):
        """The factor the loss is multiplied by now (None: no scaling)."""
        return self._loss_scale

    def check_nan_in_grads(self):
        """With dynamic scaling, note whether a gradient holds inf or NaN
        (then :meth:`is_safe_to_update` is False), with a warning naming
        the parameters."""
        self._loss_scaling_isnan = False
        if not self._loss_scaling_is_dynamic:
            return
        named = [(name, p.grad) for name, p in self.target.namedparams()
                 if p.grad is not None]
        # One host read on the good path (a GPU waits once, not per array).
        if backend.all_finite([g for _, g in named]):
            return
        bad = [name for name, g in named if not backend.all_finite([g])]
        if bad:
            self._loss_scaling_isnan = self._loss_scaling_isnan_ever = True
            warnings.warn('{}: update {} skipped: the gradient of {} holds '
                          'inf or NaN at loss scale {}; the scale is '
                          'halved'.format(type(self).__name__, self.t + 1,
                                          ', '.join(bad[:3]) + (
                                              ' and {} more'.format(
                                                  len(bad) - 3)
                                              if len(bad) > 3 else ''),
                                          self._loss_scale), RuntimeWarning)

    def is_safe_to_update(self):
        """False when :meth:`check_nan_in_grads` found inf or NaN."""
        return not self._loss_scaling_isnan

    def update_loss_scale(self):
        """After an update: halve the dynamic scale if it was skipped, else
        grow it (doubling before the first overflow)."""
        if not self._loss_scaling_is_dynamic:
            return
        if self._loss_scaling_isnan:
            multiplier = 0.5
        elif self._loss_scaling_isnan_ever:
            multiplier = self._loss_scaling_multiplier
        else:
            multiplier = 2.0
        self._loss_scale = max(1.0, min(self._loss_scale_max,
                                        self._loss_scale * multiplier))

    def unscale_grads(self):
        """Divide every gradient by the loss scale (rebinding ``grad``: an
        array may be shared by two parameters)."""
        scale = self._loss_scale
        if scale is None or scale == 1.0:
            return
        for param in self.target.params(include_uninit=False):
            if param.grad is not None:
                param.grad = param.grad * param.grad.dtype.type(1.0 / scale)
