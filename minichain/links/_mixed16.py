"""Chainer's mixed16 in the links: float32 parameters, 16-bit products.

Under ``config.dtype = 'mixed16'`` the parameters stay float32 (they are
the master copy the optimizer updates) and the activations are 16-bit:
float16 on the GPU, bfloat16 on the CPU (``backend.mixed16_dtype``). A
layer with weights casts its input and its parameters to that type before
its product (``F.cast``, whose backward brings the parameter's gradient
back to float32); batch normalization computes in float32 and hands back
the 16-bit type; ``L.Classifier`` computes the loss in float32. With
``optimizer.loss_scaling()`` the 16-bit gradients neither underflow nor
overflow (float16's range; bfloat16 has float32's).
"""
from minichain import backend
from minichain import functions as F
from minichain.configuration import config, is_mixed16
from minichain.functions._check import unwrap


def on():
    """Whether ``config.dtype`` is mixed16 ('mixed16' or
    ``minichain.mixed16``)."""
    return is_mixed16(config.dtype)


def half(x, *params):
    """Under mixed16: ``x`` and ``params`` (None stays None) cast to the
    16-bit type of ``x``'s device; otherwise as they are."""
    if not on():
        return (x,) + params
    dtype = backend.mixed16_dtype(backend.get_array_module(unwrap(x)))
    return tuple(None if v is None else F.cast(v, dtype)
                 for v in (x,) + params)


def in_float32(x, compute):
    """``compute(x)`` in float32 for a 16-bit ``x`` under mixed16, the
    result cast back to ``x``'s type (batch normalization's statistics and
    the loss want float32's precision); otherwise ``compute(x)``."""
    dtype = unwrap(x).dtype
    if not on() or dtype.itemsize >= 4:
        return compute(x)
    return F.cast(compute(F.cast(x, 'float32')), dtype)
