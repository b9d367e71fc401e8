"""Global configuration: ``minichain.config`` and the context managers on it.

Chainer keeps configuration in a thread-local object; we do the same so that a
background thread (e.g. a prefetching iterator) never flips training mode for
the main one.
"""
import contextlib
import os
import threading

import numpy

_DEFAULTS = {
    'enable_backprop': True,   # record the graph during forward
    'train': True,             # dropout on, batch norm uses batch statistics
    'debug': False,            # NaN checks; input-value checks that sync a GPU
    # default dtype of initializers and data; 'mixed16': float32
    # parameters, 16-bit activations (Chainer's mixed16; links/_mixed16.py)
    'dtype': 'float32',
    # Registered kernels (minichain/kernels) may run instead of the ops'
    # bodies; off, every op runs its plain NumPy/CuPy body.
    'use_kernels': os.environ.get('MINICHAIN_KERNELS', '1') != '0',
    # oneDNN's CPU kernels (minichain/kernels/onednn): 'auto' (when the
    # library loads), 'always' (an error when it cannot), 'never'.
    'use_onednn': os.environ.get('MINICHAIN_ONEDNN', 'auto'),
    # cuDNN's GPU kernels (minichain/kernels/cudnn): the same three modes.
    'use_cudnn': os.environ.get('MINICHAIN_CUDNN', 'auto'),
    # How float32 matrix products and convolutions may round their factors
    # (oneDNN's fpmath mode, cuBLAS's compute type): 'strict' (float32),
    # 'bf16' (bfloat16 factors, float32 sums), 'tf32' (the GPU's TF32).
    'fp32_math': os.environ.get('MINICHAIN_FP32_MATH', 'strict'),
}
FP32_MATH = ('strict', 'bf16', 'tf32')


class _Config(threading.local):
    """Thread-local configuration; unknown names raise ``AttributeError``."""

    def __init__(self):
        self.__dict__.update(_DEFAULTS)

    def __getattr__(self, name):  # only called when normal lookup fails
        raise AttributeError(
            'minichain.config has no entry {!r}; known entries: {}'.format(
                name, ', '.join(sorted(self.__dict__))))

    def show(self):
        """A printable listing of every entry and its current value."""
        return '\n'.join('{:<16}{}'.format(k, v)
                         for k, v in sorted(self.__dict__.items()))


config = _Config()


@contextlib.contextmanager
def using_config(name, value):
    """Set ``config.<name>`` to ``value`` for the duration of a ``with`` block.

    The previous value comes back on exit, also when the block raises; an
    entry that did not exist before is removed again.
    """
    existed = name in config.__dict__
    old = config.__dict__.get(name)
    setattr(config, name, value)
    try:
        yield
    finally:
        if existed:
            setattr(config, name, old)
        else:
            delattr(config, name)


def fp32_math():
    """``config.fp32_math``, checked: 'strict', 'bf16' or 'tf32'."""
    mode = config.fp32_math
    if mode not in FP32_MATH:
        raise ValueError('config.fp32_math must be one of {}, got {!r} '
                         '(MINICHAIN_FP32_MATH sets its default)'.format(
                             ', '.join(map(repr, FP32_MATH)), mode))
    return mode


def no_backprop_mode():
    """Context manager in which functions record no graph (inference,
    parameter updates): outputs have ``creator`` None."""
    return using_config('enable_backprop', False)


def force_backprop_mode():
    """Context manager that records the graph even inside
    ``no_backprop_mode``."""
    return using_config('enable_backprop', True)


class _Mixed16:
    """Chainer's ``mixed16`` dtype name (``config.dtype = minichain.mixed16``
    or ``'mixed16'``): float16 where a dtype is asked for, and
    ``map_mixed16`` where :func:`get_dtype` is given one."""

    dtype = numpy.dtype(numpy.float16)

    def __repr__(self):
        return "dtype('mixed16')"


mixed16 = _Mixed16()


def get_dtype(dtype=None, map_mixed16=None):
    """The dtype to create arrays with, as Chainer's ``get_dtype``.

    Args:
        dtype: a dtype specifier; None means ``config.dtype``.
        map_mixed16: used instead when the dtype is Chainer's ``mixed16``
            (:data:`mixed16` or ``'mixed16'``; float16 if None, as
            Chainer's; the initializers pass float32, the parameters'
            dtype under mixed16).

    Returns:
        a ``numpy.dtype``.
    """
    if dtype is None:
        dtype = config.dtype
    if is_mixed16(dtype):
        dtype = numpy.float16 if map_mixed16 is None else map_mixed16
    return numpy.dtype(dtype)


def is_mixed16(dtype):
    """Whether ``dtype`` is Chainer's mixed16 (:data:`mixed16` or
    ``'mixed16'``)."""
    return dtype is mixed16 or isinstance(dtype, str) and dtype == 'mixed16'
