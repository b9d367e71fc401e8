"""What the NCCL communicators share: the NCCL module, its dtypes, the
bfloat16 codec, and the one-GPU-per-rank check; and ChainerMN's
``chainermn.nccl``: any other name (``NcclCommunicator``,
``get_unique_id``, ``NCCL_SUM``...) is CuPy's ``cupy.cuda.nccl``'s, looked
up when first read (``_available``: whether they can be read).

CuPy and NCCL are reached only through ``minichain.backend`` and only when
called, so importing this module needs neither. The unique ID -> broadcast
-> NCCL init sequence itself opens :mod:`minichain.dist.pure_nccl`.
"""
import numpy

from minichain import backend
from minichain.dist import mpi
from minichain.dist.failures import format_ranks

BFLOAT16 = 'bfloat16'


def nccl_module():
    """``cupy.cuda.nccl``, or a RuntimeError saying what is missing: CuPy
    or a GPU (the backend's error), or NCCL."""
    backend.check_cuda_available()
    try:
        return backend.get_nccl()
    except RuntimeError as e:
        raise RuntimeError('pure_nccl: {}'.format(e)) from e


def nccl_dtype(nccl, dtype):
    """The NCCL type constant for a NumPy dtype (or ``'bfloat16'``)."""
    name = BFLOAT16 if dtype == BFLOAT16 else numpy.dtype(dtype).name
    attr = {'float16': 'NCCL_FLOAT16', 'float32': 'NCCL_FLOAT32',
            'float64': 'NCCL_FLOAT64', 'bfloat16': 'NCCL_BFLOAT16',
            'uint8': 'NCCL_UINT8'}.get(name)
    if attr is None or not hasattr(nccl, attr):
        raise RuntimeError('pure_nccl: this NCCL cannot reduce {}'.format(name))
    return getattr(nccl, attr)


def to_bfloat16_bits(x32):
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even.

    NaN stays NaN (quiet, same sign): the rounding bias would carry a NaN's
    mantissa into the exponent, so that CUDA's canonical NaN 0x7FFFFFFF
    wraps to 0x8000 (-0.0), 0xFFFFFFFF to 0x0000 and a NaN with only low
    mantissa bits rounds to inf, and the finite check after the allreduce
    would pass over them.
    """
    xp = backend.get_array_module(x32)
    bits = x32.view(xp.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(xp.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    quiet = ((bits >> 16) | 0x0040).astype(xp.uint16)
    return xp.where(nan, quiet, rounded)


def from_bfloat16_bits(b16):
    """bfloat16 bit patterns (uint16) -> float32."""
    xp = backend.get_array_module(b16)
    return (b16.astype(xp.uint32) << 16).view(xp.float32)


def widen(host):
    """A host copy of a wire buffer in a dtype MPI can sum: bfloat16 bit
    patterns (uint16, see :func:`to_bfloat16_bits`) and float16 become
    float32."""
    if host.dtype == numpy.uint16:
        return from_bfloat16_bits(host)
    return host.astype(numpy.float32) if host.itemsize < 4 else host


def narrow(wide, dtype):
    """:func:`widen` undone, into the wire's ``dtype``."""
    if dtype == numpy.uint16:
        return to_bfloat16_bits(numpy.ascontiguousarray(wide))
    return wide.astype(dtype, copy=False)


def check_one_gpu_per_rank(mpi_comm, device_id, where):
    """Raise on every rank when two ranks would drive the same GPU.

    NCCL needs one GPU per rank; ranks that never selected a device all sit
    on GPU 0, which this catches before NCCL hangs or fails obscurely.
    """
    from minichain.device import gpu_bus_id
    MPI = mpi.import_mpi()
    bus = gpu_bus_id(device_id)
    keys = mpi_comm.allgather((MPI.Get_processor_name(), bus, device_id))
    seen = {}
    for r, key in enumerate(keys):
        seen.setdefault(key[:2], []).append(r)
    shared = [(key, ranks) for key, ranks in seen.items() if len(ranks) > 1]
    if shared:
        (node, bus_id), ranks = shared[0]
        raise RuntimeError(
            '{}: {} all use GPU {} (bus {}) on node {}; NCCL needs one GPU per '
            'rank. Select a device per rank before creating the model: '
            'device = minichain.device.get_rank_device(comm.intra_rank, '
            'comm.intra_size); model.to_device(device)'.format(
                where, format_ranks(ranks), keys[ranks[0]][2], bus_id,
                node))


def __getattr__(name):
    """``chainermn.nccl``'s names: CuPy's NCCL module's; where NCCL cannot
    run, an AttributeError saying what is missing (CuPy, a GPU or NCCL)."""
    if name.startswith('__'):
        raise AttributeError(name)
    try:
        nccl = backend.get_nccl()
    except RuntimeError as e:
        if name == '_available':
            return False
        raise AttributeError('minichain.dist.nccl.{}: NCCL is not usable '
                             'here: {}'.format(name, e)) from None
    return True if name == '_available' else getattr(nccl, name)
