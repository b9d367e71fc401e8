"""Compile CuPy kernels through CuPy's own code generator without a GPU.

A ``cupy.ElementwiseKernel`` or ``ReductionKernel`` is built in three
steps at its first call:

1. from the call's arguments, CuPy derives an ``_ArgInfo`` per argument
   (dtype, ndim, C-contiguity, 32- or 64-bit indexing) and the type map
   (what ``T`` is);
2. its generator writes the CUDA source from them
   (``_kernel._get_elementwise_kernel_code``, ``_reduction.
   _ReductionKernel_get_cached_function_code``, and a CUB block-reduction
   template in ``_cub_reduction``);
3. ``core.compile_with_cache`` prepends CuPy's headers, adds its compiler
   options (C++17, the include paths of its bundled CCCL and of the CUDA
   headers) and calls ``cupy.cuda.compiler._compile_with_cache_cuda``,
   which runs NVRTC and hands the cubin to the driver.

Without a GPU step 1 cannot run (it asks the driver for the current device
and needs device arrays), and step 3 ends in ``cuModuleLoadData``. CuPy
itself imports fine without ``libcuda`` (it loads the driver lazily), and
NVRTC needs no driver. So this module builds the ``_ArgInfo`` tuple that
minichain's calls produce (``variants.py`` says which), then calls CuPy's
cached-function builders taken out of their per-device memo (their
``__wrapped__``): steps 2 and 3 run as in a real call, header and options
included. For the duration, :func:`offline` replaces three names in the
pure-Python ``cupy.cuda.compiler``: ``_get_arch`` and
``_get_arch_for_options_for_nvrtc`` (they ask the device for its compute
capability; here the arch is given) and ``function`` (whose ``Module.load``
keeps the cubin instead of giving it to the driver), and sets
``CUPY_CACHE_IN_MEMORY=1`` so that every call compiles (a cubin cached on
disk would skip NVRTC).

This uses CuPy internals (checked with CuPy 14.2): ``_kernel._ArgInfo``,
``_kernel._get_param_info``, ``_kernel._TypeMap._pairs``, the builders
named above and ``compiler._get_arch*``. A CuPy that renames one fails
loudly here (AttributeError), never silently. On a machine with a GPU,
``tests/cuda/test_kernels_compile.py`` also checks that the source built
here equals what CuPy generated in a real call.
"""
import contextlib
import os
import types

import cupy
import numpy
from cupy._core import _carray, _cub_reduction, _kernel, _reduction, _scalar
from cupy.cuda import compiler, function

_NDARRAY, _INDEXER, _SCALAR = 1, 2, 3  # cupy/_core/_kernel.pxd: _ArgKind
CompileException = compiler.CompileException


# -- arguments as CuPy sees them ----------------------------------------------
def array(dtype, ndim=1, c_contiguous=True):
    """An ndarray argument (after CuPy's dimension reduction)."""
    return ('array', numpy.dtype(dtype), ndim, c_contiguous)


def scalar(dtype):
    """A scalar argument (CuPy gives it the parameter's dtype)."""
    return ('scalar', numpy.dtype(dtype))


def _arginfo(arg, index32):
    if arg[0] == 'array':
        return _kernel._ArgInfo(_NDARRAY, cupy.ndarray, arg[1], arg[2],
                                arg[3], index32)
    return _kernel._ArgInfo(_SCALAR, _scalar.CScalar, arg[1], 0, True, True)


def _indexer(ndim, index32):
    return _kernel._ArgInfo(_INDEXER, _carray.Indexer, None, ndim, True,
                            index32)


def _dtypes(args):
    return tuple(a[1] if a[0] == 'array' else None for a in args)


# -- the three kinds of kernel ------------------------------------------------
def elementwise(kernel, args, index32, compile=True):
    """Generate (and compile) ``kernel`` for ``args`` (inputs then outputs,
    as passed by the caller); the indexer has the ndim of the non-raw
    arrays. Returns the source, or the cubin when ``compile``."""
    nin = kernel.nin
    _, _, type_map = kernel._decide_params_type(_dtypes(args[:nin]),
                                                _dtypes(args[nin:]))
    ndim = max([a[2] for a, p in zip(args, kernel.params)
                if a[0] == 'array' and not p.raw] or [1])
    infos = tuple(_arginfo(a, index32) for a in args) + (
        _indexer(ndim, index32),)
    call = (infos, type_map, kernel.params, kernel.operation, kernel.name,
            kernel.preamble)
    if not compile:
        return _kernel._get_elementwise_kernel_code(*call, **kernel.kwargs)
    _kernel._get_elementwise_kernel.__wrapped__(*call, **kernel.kwargs)
    return _last_cubin(kernel.name)


def _reduction_types(kernel, args, extra):
    """CuPy's type map for a reduction, with ``extra`` (name, type) pairs."""
    nin = kernel.nin
    types_in = tuple(a[1].type if a[0] == 'array' else None
                     for a in args[:nin])
    types_out = tuple(a[1].type for a in args[nin:])
    _, _, type_map = _kernel._decide_params_type(
        kernel.in_params, kernel.out_params, types_in, types_out)
    return _kernel._TypeMap(type_map._pairs + tuple(extra))


def reduction(kernel, args, in_ndim, out_ndim, index32, block_size=512,
              compile=True):
    """A ``ReductionKernel`` as CuPy's own (non-CUB) reduction launches it:
    ``args`` are the inputs and the output, ``in_ndim``/``out_ndim`` the
    dimensions of the reduced and kept index spaces, ``block_size`` the
    threads of a block (CuPy's choice, ``_reduction._get_block_specs``: at
    most 512)."""
    type_map = _reduction_types(
        kernel, args, [('IndexT', 'int32' if index32 else 'int64')])
    infos = tuple(_arginfo(a, index32) for a in args) + (
        _indexer(in_ndim, index32), _indexer(out_ndim, index32),
        _arginfo(scalar(numpy.int32), True))
    call = (kernel.nin, kernel.nout, kernel._params, infos, type_map,
            kernel.name, block_size, kernel.reduce_type, kernel.identity,
            kernel.map_expr, kernel.reduce_expr, kernel.post_map_expr,
            kernel.preamble, kernel.options)
    if not compile:
        return _reduction._ReductionKernel_get_cached_function_code(*call)
    _reduction._ReductionKernel_get_cached_function.__wrapped__(*call)
    return _last_cubin(kernel.name)


def cub_reduction(kernel, args, index32, block_size=512, items_per_thread=4):
    """A one-input ``ReductionKernel`` as CuPy launches it through CUB when
    the reduced axes are the contiguous ones (``_cub_reduction.
    _try_to_call_cub_reduction``: its renaming of the parameters to
    in0/out0 included), one segment per kept element."""
    P = _kernel._get_param_info
    size_t = 'int32' if index32 else 'uint64'
    (x, y), old_in, old_out = args, kernel.in_params[0].name, \
        kernel.out_params[0].name
    type_map = _reduction_types(kernel, args, [
        ('sizeT', size_t), ('type_in0_raw', x[1].type),
        ('type_out0_raw', y[1].type)])
    params = (P('T in0', True) + P('T out0', False)
              + P(size_t + ' _segment_size', True)
              + P(size_t + ' _array_size', True))
    infos = (_arginfo(x, index32), _arginfo(y, index32),
             _arginfo(scalar(size_t), True), _arginfo(scalar(size_t), True))
    _cub_reduction._SimpleCubReductionKernel_get_cached_function.__wrapped__(
        kernel.map_expr.replace(old_in, 'in0'), kernel.reduce_expr,
        kernel.post_map_expr.replace(old_out, 'out0'), kernel.reduce_type,
        params, infos, type_map, kernel.name, block_size, kernel.identity,
        kernel.preamble, (), items_per_thread)
    return _last_cubin(kernel.name)


# -- compiling without a driver -----------------------------------------------
_cubins = []


class _KeptModule(function.Module):
    """A ``cupy.cuda.function.Module`` that keeps the cubin NVRTC made
    (``load`` would hand it to the driver)."""

    def load(self, cubin):
        _cubins.append(cubin)

    def get_function(self, name):
        return function.Function.__new__(function.Function)

    def _set_mapping(self, mapping):
        pass


def _last_cubin(name):
    cubin = _cubins[-1]
    if name.encode() not in cubin:
        raise AssertionError('{}: the cubin has no symbol {}'.format(
            name, name))
    return cubin


@contextlib.contextmanager
def offline(arch):
    """Within the block, CuPy compiles for ``sm_<arch>`` (e.g. ``'90'``)
    and keeps the result instead of loading it (see the module docstring).
    """
    saved = {n: getattr(compiler, n) for n in (
        '_get_arch', '_get_arch_for_options_for_nvrtc', 'function')}
    options = saved['_get_arch_for_options_for_nvrtc'].__wrapped__
    shim = types.SimpleNamespace(**vars(function))
    shim.Module = _KeptModule
    compiler._get_arch = lambda: arch
    compiler._get_arch_for_options_for_nvrtc = \
        lambda a=None: options(a or arch)
    compiler.function = shim
    in_memory = os.environ.get('CUPY_CACHE_IN_MEMORY')
    os.environ['CUPY_CACHE_IN_MEMORY'] = '1'
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(compiler, n, v)
        if in_memory is None:
            del os.environ['CUPY_CACHE_IN_MEMORY']
        else:
            os.environ['CUPY_CACHE_IN_MEMORY'] = in_memory
        del _cubins[:]


def cubin_arch(cubin):
    """The ``sm_XX`` an ELF cubin was built for (EI_ABIVERSION / e_flags)."""
    if cubin[:4] != b'\x7fELF':
        raise AssertionError('not an ELF cubin: {!r}'.format(cubin[:8]))
    flags = int.from_bytes(cubin[48:52], 'little')
    # CUDA 12.x: arch in bits 0-7; CUDA 13 ABI: bits 8-15 (EF_CUDA_SM)
    return flags & 0xFF if cubin[8] < 8 else (flags >> 8) & 0xFF
