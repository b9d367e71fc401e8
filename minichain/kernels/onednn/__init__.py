"""oneDNN kernels for NumPy arrays, through ctypes (``_dnnl.py``).

oneDNN is the library PyTorch's CPU convolutions run on; the
``onednn-cpu-gomp`` wheel (the ``onednn`` extra, Linux x86-64) ships it
without Python code, and ``_dnnl.py`` binds the few calls used. As
Chainer did with iDeep (``config.use_ideep``), ``config.use_onednn``
chooses, its default taken from ``MINICHAIN_ONEDNN``:

- ``'auto'``: use oneDNN when the library loads, else run the next
  kernel or the op's body, silently;
- ``'always'``: as 'auto', but a library that does not load is an error
  (one line: why, and how to install it);
- ``'never'``: the kernels decline; the NumPy path runs.

Importing this package never raises for a missing library: the kernels
are registered and decline when it cannot load.
"""
from minichain import kernels
from minichain.configuration import config
from minichain.functions import convolution as _conv
from minichain.functions import normalization as _norm
from minichain.kernels.onednn import _dnnl
from minichain.kernels.onednn import convolution, normalization

_MODES = ('auto', 'always', 'never')
_load_error = None   # why the library did not load (a sentence), once tried
_tried = False


def available():
    """Whether the library loaded (tried once, on first call)."""
    global _tried, _load_error
    if not _tried:
        _tried = True
        try:
            _dnnl.load()
        except OSError as e:
            _load_error = str(e)
    return _dnnl.lib is not None


def enabled():
    """Whether the oneDNN kernels run now, by ``config.use_onednn``."""
    mode = config.use_onednn
    if mode == 'never':
        return False
    if mode not in _MODES:
        raise ValueError('config.use_onednn must be one of {}, got {!r} '
                         '(MINICHAIN_ONEDNN sets its default)'.format(
                             ', '.join(map(repr, _MODES)), mode))
    if available():
        return True
    if mode == 'always':
        raise RuntimeError(
            "config.use_onednn is 'always' but oneDNN cannot be used: {}; "
            "install it with pip install onednn-cpu-gomp==2023.2.0 (Linux "
            "x86-64 only; in a minichain checkout: pip install -e "
            "'.[onednn]') or set "
            "MINICHAIN_ONEDNN=auto".format(_load_error))
    return False


def _gated(kernel):
    """The kernel, declining whenever :func:`enabled` says no."""
    def run(node, inputs):
        return kernel(node, inputs) if enabled() else None
    run.__name__ = run.__qualname__ = kernel.__name__
    run.__wrapped__ = kernel
    return run


# Registered: the convolutions. Not registered: batch normalization
# (normalization.py, tested against the body all the same). On NCHW,
# oneDNN's batch normalization measured 1.8-16x slower than the body's
# (bench/README.md, "oneDNN kernels"); it pays in oneDNN's blocked layout,
# which would have to be kept between ops.
REGISTERED = (
    (_conv.Convolution2D, convolution.convolution_2d),
    (_conv.Deconvolution2D, convolution.deconvolution_2d),
    (_conv.Convolution2DGradW, convolution.convolution_2d_grad_w),
)
UNREGISTERED = (
    (_norm.BatchNormalization, normalization.batch_normalization),
    (_norm.BatchNormalizationGrad, normalization.batch_normalization_grad),
)
for _type, _kernel in REGISTERED:
    kernels.register(_type, 'onednn', _gated(_kernel))
