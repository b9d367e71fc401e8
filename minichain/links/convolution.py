"""The 2-D convolution layer: L.Convolution2D."""
from minichain import functions as F
from minichain.link import Link
from minichain.links import _mixed16
from minichain.links.linear import _weight_and_bias

__all__ = ['Convolution2D']


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


class Convolution2D(Link):
    """A 2-D convolution over NCHW inputs (``F.convolution_2d``).

    Args:
        in_channels: input channels, or None to infer them from the first
            input (lazy initialization).
        out_channels: output channels.
        ksize: kernel size, an int or ``(kh, kw)``. Chainer's short form
            ``Convolution2D(out_channels, ksize)`` means
            ``Convolution2D(None, out_channels, ksize)``.
        stride, pad, dilate: an int or a pair each.
        nobias: if True, no bias ``b``.
        initialW: initializer, scalar or array for ``W``; default
            ``LeCunNormal()`` (fan_in = in_channels / groups * kh * kw).
        initial_bias: initializer, scalar or array for ``b``; default 0
            (in ``W``'s dtype when ``initialW`` fixes one).
        groups: number of channel groups; both channel counts must be
            divisible by it.

    Attributes:
        W: Parameter ``(out_channels, in_channels // groups, kh, kw)``.
        b: Parameter ``(out_channels,)``, or None.

    Input ``(N, in_channels, H, W)``; output ``(N, out_channels, H', W')``.
    """

    def __init__(self, in_channels, out_channels, ksize=None, stride=1,
                 pad=0, nobias=False, initialW=None, initial_bias=None,
                 dilate=1, groups=1):
        super().__init__()
        if ksize is None:
            in_channels, out_channels, ksize = None, in_channels, out_channels
        if ksize is None or out_channels is None:
            raise ValueError('Convolution2D: out_channels and ksize are '
                             'required')
        groups = int(groups)
        if groups < 1 or out_channels % groups:
            raise ValueError('Convolution2D: out_channels={} is not divisible '
                             'by groups={}'.format(out_channels, groups))
        self.in_channels, self.out_channels = in_channels, out_channels
        self.ksize, self.stride, self.pad = _pair(ksize), stride, pad
        self.dilate, self.groups, self.nobias = dilate, groups, nobias
        with self.init_scope():
            self.W, self.b = _weight_and_bias(
                initialW, initial_bias, nobias, out_channels,
                None if in_channels is None else self._w_shape(in_channels))

    def _w_shape(self, in_channels):
        if in_channels % self.groups:
            raise ValueError('Convolution2D: in_channels={} is not divisible '
                             'by groups={}'.format(in_channels, self.groups))
        self.in_channels = in_channels
        return (self.out_channels, in_channels // self.groups) + self.ksize

    def forward(self, x):
        """Apply the convolution to ``x`` of shape ``(N, C, H, W)``."""
        if not self.W.is_initialized:
            if x.ndim != 4:
                raise ValueError('Convolution2D: input must be (N, C, H, W), '
                                 'got shape {}'.format(x.shape))
            self.W.initialize(self._w_shape(int(x.shape[1])))
        x, W, b = _mixed16.half(x, self.W, self.b)
        return F.convolution_2d(x, W, b, stride=self.stride,
                                pad=self.pad, dilate=self.dilate,
                                groups=self.groups)

    def _repr_args(self):
        return ('in_channels={}, out_channels={}, ksize={}, stride={}, pad={}'
                ', nobias={}{}{}'.format(
                    self.in_channels, self.out_channels, self.ksize,
                    self.stride, self.pad, self.nobias,
                    '' if self.dilate == 1 else ', dilate={}'.format(
                        self.dilate),
                    '' if self.groups == 1 else ', groups={}'.format(
                        self.groups)))
