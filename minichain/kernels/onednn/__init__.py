"""oneDNN kernels for NumPy arrays, through ctypes (``_dnnl.py``).

oneDNN is the library PyTorch's CPU convolutions run on; the
``onednn-cpu-gomp`` wheel (the ``onednn`` extra, Linux x86-64) ships it
without Python code, and ``_dnnl.py`` binds the few calls used. As
Chainer did with iDeep (``config.use_ideep``), ``config.use_onednn``
chooses, its default taken from ``MINICHAIN_ONEDNN``: 'auto', 'always'
or 'never', as ``kernels/_switch.py`` says ('never': the NumPy path runs).

Importing this package never raises for a missing library: the kernels
are registered and decline when it cannot load.
"""
from minichain import kernels
from minichain.configuration import config, fp32_math
from minichain.kernels import _switch
from minichain.functions import activation as _act
from minichain.functions.array import Cast as _Cast
from minichain.functions import basic_math as _math
from minichain.functions import convolution as _conv
from minichain.functions.linear import LinearFunction as _Linear
from minichain.functions import normalization as _norm
from minichain.functions import pooling as _pool
from minichain.kernels.onednn import _binary, _dnnl, _fpmath
from minichain.kernels.onednn import (activation, cast, convolution, linear,
                                      normalization, optimizers, pooling)
from minichain.optimizers.momentum_sgd import MomentumSGDRule as _MSGD

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


def _problem():
    if available():
        return ''
    return ('{}; install it with pip install onednn-cpu-gomp==2023.2.0 '
            '(Linux x86-64 only; in a minichain checkout: pip install -e '
            "'.[onednn]')".format(_load_error))


def enabled():
    """Whether the oneDNN kernels run now, by ``config.use_onednn``."""
    return _switch.enabled('onednn', 'oneDNN', _problem)


def bf16_compute():
    """(whether ``config.fp32_math = 'bf16'`` computes in bfloat16 on this
    CPU, oneDNN's name of the instructions it dispatches to or why it
    cannot): what a program that turns bf16 on where it pays asks first
    (models/train_resnet50.py)."""
    if not enabled():
        return False, ('oneDNN is not in use' if available() else
                       'oneDNN is not installed')
    isa = _fpmath.effective_isa()[0]
    return _fpmath.has_bf16(), isa


def _gated(kernel, bf16_only=False):
    """The kernel, declining whenever :func:`enabled` says no (and, when
    ``bf16_only``, unless the arrays are bfloat16 or ``config.fp32_math``
    is 'bf16' and the CPU has the instructions: ``_fpmath.py``)."""
    def run(node, inputs):
        math = fp32_math()    # checked at every call, whatever runs
        if not enabled():
            if math != 'strict':
                _fpmath.fall_back('oneDNN is not in use ({})'.format(
                    _load_error or 'use_onednn is {!r}'.format(
                        config.use_onednn)))
            return None
        if bf16_only and inputs[0].dtype.name != 'bfloat16' and (
                math != 'bf16' or _fpmath.mode() != 'bf16'):
            return None
        return kernel(node, inputs)
    run.__name__ = run.__qualname__ = kernel.__name__
    run.__wrapped__ = kernel
    return run


# Registered where oneDNN measured faster than the NumPy kernel, in
# interleaved pairs at ResNet-50's shapes (bench/onednn_ops.py; NumPy time
# / oneDNN time, median and quartiles of 21 pairs, 2 threads, AMD EPYC,
# 2026-12-02; docs/kernels.md):
# - the convolutions;
# - ReLU forward + backward: 1.1-2.2x at 6 of 7 activation shapes (batch
#   32 at 14x14 to 2x2, batch 8 at 112 and 56), 0.90x (0.53-1.80: no
#   difference) at 32x256x14x14 (arrays under 16384 elements declined:
#   0.80x at 32x100);
# - max and average pooling forward + backward, 3x3/2 pad 1 at 8x64x112
#   (ResNet-50's stem pooling at 224): 5.1x and 4.7x.
# - batch normalization forward + backward on the channels-last arrays
#   the convolutions return (normalization.py): 3.6-8.5x the NumPy
#   kernel on NCHW, 1.3-4.7x on channel-major arrays, at ResNet-50's
#   shapes (Intel Xeon, AVX-512, 2026-12-02, bench/onednn_layers.py).
# - inference-mode batch normalization on channels-last arrays: 1.5-3.2x
#   the NumPy kernel; an evaluation's forward at batch 200 1.07-1.08x
#   (one thread, Intel Xeon, 2026-12-03, bench/onednn_layers.py).
# - MomentumSGD's update (optimizers.py): 1.64x the body over ResNet-50's
#   parameters with weight decay, 1.92x the body plus the WeightDecay
#   hook (one thread, Intel Xeon, 2026-12-03, bench/onednn_update.py).
# - Cast between float32 and bfloat16 (mixed16's casts): 5.9-17x
#   ml_dtypes' astype (cast.py).
# Written, tested and not registered:
# - global average pooling: 0.07-0.08x (NumPy's mean over contiguous
#   maps is one pass; oneDNN's whole-map window is not);
# - linear and its backward (MatMul): 0.63x at 32x2048->10 (make train's
#   classifier), 1.88x at 8x2048->1000: mixed, and under 0.1% of a step;
#   registered for config.fp32_math 'bf16' only (BF16_ONLY), where only
#   oneDNN computes bfloat16.
REGISTERED = (
    (_conv.Convolution2D, convolution.convolution_2d),
    (_conv.Deconvolution2D, convolution.deconvolution_2d),
    (_conv.Convolution2DGradW, convolution.convolution_2d_grad_w),
    (_norm.BatchNormalization, normalization.batch_normalization),
    (_norm.BatchNormalizationGrad, normalization.batch_normalization_grad),
    (_norm.FixedBatchNormalization,
     normalization.fixed_batch_normalization),
    (_act.ReLU, activation.relu),
    (_act.ReLUGrad, activation.relu_grad),
    (_math.Add, _binary.add),
    (_pool.MaxPooling2D, pooling.max_pooling_2d),
    (_pool.MaxPooling2DGrad, pooling.max_pooling_2d_grad),
    (_pool.AveragePooling2D, pooling.average_pooling_2d),
    (_pool.AveragePooling2DGrad, pooling.average_pooling_2d_grad),
    (_MSGD, optimizers.momentum_sgd),
    (_Cast, cast.cast),
)
UNREGISTERED = (
    (_pool.GlobalAveragePooling2D, pooling.global_average_pooling_2d),
    (_Linear, linear.linear),
    (_math.MatMul, linear.matmul),
)
# The products that config.fp32_math = 'bf16' computes in bfloat16
# (_fpmath.py); the convolutions among them are in REGISTERED.
BF16_ONLY = (
    (_Linear, linear.linear),
    (_math.MatMul, linear.matmul),
)
for _type, _kernel in REGISTERED:
    kernels.register(_type, 'onednn', _gated(_kernel))
for _type, _kernel in BF16_ONLY:
    kernels.register(_type, 'onednn', _gated(_kernel, bf16_only=True))
