"""bfloat16 math for float32 arrays: ``config.fp32_math`` on oneDNN.

Under ``using_config('fp32_math', 'bf16')`` the convolution and inner
product kernels still take and return float32 arrays, but their
primitives read the inputs as bfloat16 (8 bits of mantissa) and write
float32, with float32 sums: the plan's reorder that brings an input into
the primitive's layout rounds it to bfloat16 in the same pass, as
PyTorch's CPU autocast does. Why data types and not oneDNN's floating-
point math mode (``dnnl_primitive_attr_set_fpmath_mode``, the same
arithmetic asked of a float32 primitive): oneDNN 3.2 honours that mode
on AMX only (``maybe_try_bf32`` in src/cpu/x64/brgemm/brgemm_utils.cpp;
``bf32_dt`` in the matmul) and silently computes float32 on AVX512_BF16,
which a test here showed (same bits, same ``brgconv:avx512_core``).

It pays only where the CPU has bfloat16 dot products (AVX512_BF16, or
AMX): oneDNN says which instructions it dispatches to
(``dnnl_get_effective_cpu_isa``, capped by ``ONEDNN_MAX_CPU_ISA``).
Elsewhere, and where oneDNN is not in use, the CPU computes float32 and a
RuntimeWarning says so, once per process: a script that asks for bf16
runs everywhere, at float32's speed and accuracy where the hardware
cannot do better. Batch normalization, pooling, the losses, the
optimizer's update and the allreduce are not products and stay float32.
A primitive is built for its data types, so the mode is part of the
kernels' cache keys.
"""
import ctypes
import functools
import warnings

from minichain import configuration
from minichain.kernels.onednn import _dnnl as L

# dnnl_cpu_isa_t; an ISA's bits include those of every ISA it extends.
ISA_NAMES = {0x1: 'sse41', 0x3: 'avx', 0x7: 'avx2', 0xf: 'avx2_vnni',
             0x1f: 'avx2_vnni_2', 0x27: 'avx512_core',
             0x67: 'avx512_core_vnni', 0xe7: 'avx512_core_bf16',
             0x1ef: 'avx512_core_fp16', 0xfef: 'avx512_core_amx',
             0x1fef: 'avx512_core_amx_fp16'}
AVX512_CORE_BF16 = 0xe7
_warned = False


@functools.lru_cache(maxsize=None)
def effective_isa():
    """(oneDNN's name of the instruction set it dispatches to, e.g.
    'avx512_core_bf16', and its number); asked once, the library loaded.
    """
    fn = L.lib.dnnl_get_effective_cpu_isa
    fn.argtypes, fn.restype = (), ctypes.c_int
    isa = fn()
    return ISA_NAMES.get(isa, hex(isa)), isa


def has_bf16():
    """Whether oneDNN dispatches to bfloat16 dot products (AVX512_BF16 or
    AMX)."""
    return effective_isa()[1] & AVX512_CORE_BF16 == AVX512_CORE_BF16


def mode():
    """The math of the kernels now: 'bf16' where ``config.fp32_math`` asks
    for it and the CPU has the instructions, else 'strict'."""
    wanted = configuration.fp32_math()
    if wanted == 'strict':
        return 'strict'
    if wanted == 'bf16' and has_bf16():
        return 'bf16'
    fall_back('oneDNN dispatches to {}, which has no bfloat16 dot products '
              '(AVX512_BF16 or AMX)'.format(effective_isa()[0])
              if wanted == 'bf16' else 'TF32 is a GPU mode')
    return 'strict'


def fall_back(why):
    """Say once per process that the CPU computes float32 although
    ``config.fp32_math`` asks for less, and why."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn('config.fp32_math is {!r} but {}: the CPU computes '
                      'in float32 (said once)'.format(
                          configuration.config.fp32_math, why),
                      RuntimeWarning, stacklevel=2)


def dt(math):
    """The data type a primitive reads its factors in under ``math``."""
    return L.BF16 if math == 'bf16' else L.F32
