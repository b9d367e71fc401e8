"""A small ctypes binding of oneDNN v3.2's C API (``libdnnl.so.3``).

The PyPI wheel ``onednn-cpu-gomp==2023.2.0`` installs the library under
``<sys.prefix>/lib`` and no headers, so the enum values and struct layouts
below are copied by hand from oneDNN v3.2's public headers
(``include/oneapi/dnnl/dnnl.h``, ``dnnl_types.h``, ``dnnl_common_types.h``
at tag v3.2); :func:`load` checks ``dnnl_version()`` says 3.2 before
anything else is called, since another version may number them otherwise.

What a student needs of oneDNN to read the kernels:

- an *engine* (the CPU) and a *stream* (where primitives run, in order);
- a *memory descriptor* (md): shape, dtype and layout of a tensor. Ours
  are built from a NumPy array's strides; ``format_tag_any`` lets a
  primitive choose its own (blocked) layout;
- a *primitive descriptor* (pd): an operation fixed for given mds, from
  which a *primitive* (the compiled kernel) is created;
- ``execute(primitive, {argument: memory})``: a memory object is an md
  plus a data pointer; ours point into NumPy arrays.

:class:`Primitive` owns a primitive and one memory object per argument,
created once; each call only points them at the arrays of that call.
"""
import ctypes
import os
import sys
import threading

import numpy

# -- enum values (oneDNN v3.2 headers) ----------------------------------------
SUCCESS = 0                     # dnnl_status_t
STATUS = {1: 'out of memory', 2: 'invalid arguments', 3: 'unimplemented',
          4: 'last implementation reached', 5: 'runtime error',
          6: 'not required'}
F32, BF16 = 3, 2                # dnnl_data_type_t: dnnl_f32, dnnl_bf16
FORMAT_ANY = 1                  # dnnl_format_tag_any
CPU = 1                         # dnnl_engine_kind_t: dnnl_cpu
STREAM_IN_ORDER = 1             # dnnl_stream_in_order
FORWARD_TRAINING = 64           # dnnl_prop_kind_t
FORWARD_INFERENCE = 96
BACKWARD = 128
CONVOLUTION_DIRECT = 0x1        # dnnl_alg_kind_t
ELTWISE_RELU, ELTWISE_RELU_USE_DST = 0x20, 0x100
POOLING_MAX, POOLING_AVG_INCLUDE_PADDING = 0x1ff, 0x2ff
BINARY_ADD = 0x1fff0
USE_GLOBAL_STATS = 0x1          # dnnl_normalization_flags_t
USE_SCALE, USE_SHIFT = 0x2, 0x4
FUSE_NORM_RELU = 0x8
QUERY_IMPL_INFO_STR, QUERY_EXEC_ARG_MD = 8, 255  # dnnl_query_t
ARG_SRC, ARG_SRC_1, ARG_DST = 1, 2, 17          # DNNL_ARG_*
ARG_WEIGHTS, ARG_BIAS = 33, 41
ARG_MEAN, ARG_VARIANCE, ARG_SCALE, ARG_SHIFT = 49, 50, 51, 52
ARG_WORKSPACE = 64
ARG_ATTR_SCALES = 4096          # | ARG_*: scales given at execute time
ARG_DIFF_SRC, ARG_DIFF_DST, ARG_DIFF_WEIGHTS = 129, 145, 161
ARG_DIFF_SCALE, ARG_DIFF_SHIFT = 255, 256
MAX_NDIMS = 12                  # DNNL_MAX_NDIMS

Dims = ctypes.c_int64 * MAX_NDIMS   # dnnl_dims_t
_handle = ctypes.c_void_p           # every dnnl_*_t is an opaque pointer


class _Version(ctypes.Structure):   # dnnl_version_t
    _fields_ = [('major', ctypes.c_int), ('minor', ctypes.c_int),
                ('patch', ctypes.c_int), ('hash', ctypes.c_char_p),
                ('cpu_runtime', ctypes.c_uint),
                ('gpu_runtime', ctypes.c_uint)]


class _ExecArg(ctypes.Structure):   # dnnl_exec_arg_t
    _fields_ = [('arg', ctypes.c_int), ('memory', _handle)]


class Error(RuntimeError):
    """A oneDNN call failed (its status named in the message)."""

    def __init__(self, call, status):
        super().__init__('oneDNN {} failed: status {} ({})'.format(
            call, status, STATUS.get(status, '?')))
        self.status = status


lib = None          # the loaded ctypes.CDLL, once load() succeeded
engine = stream = None
_gomp = None        # the libgomp that oneDNN's OpenMP threads come from


def library_path():
    """Where the onednn-cpu-gomp wheel puts the library: the venv's data
    directory's lib/ (``MINICHAIN_ONEDNN_LIBRARY`` names another file)."""
    return os.environ.get('MINICHAIN_ONEDNN_LIBRARY') or os.path.join(
        sys.prefix, 'lib', 'libdnnl.so.3')


def load():
    """Load the library, check its version and create the engine and the
    stream; return the version as 'major.minor.patch'. Raises OSError (a
    sentence saying why) when it cannot."""
    global lib, engine, stream, _gomp
    if lib is not None:
        return version()
    path = library_path()
    if not os.path.exists(path):
        raise OSError('{} not found'.format(path))
    try:
        candidate = ctypes.CDLL(path)
    except OSError as e:   # e.g. the system's libgomp.so.1 is missing
        raise OSError('{} does not load: {}'.format(path, e)) from None
    # A library that loads but is not oneDNN 3.2 (MINICHAIN_ONEDNN_LIBRARY
    # set to another file) is refused here, as a missing one is, before
    # anything is called through a symbol it may not have.
    try:
        candidate.dnnl_version.restype = ctypes.POINTER(_Version)
    except AttributeError:
        raise OSError('{} is not oneDNN (it has no dnnl_version)'.format(
            path)) from None
    v = candidate.dnnl_version().contents
    if (v.major, v.minor) != (3, 2):
        raise OSError('{} is oneDNN {}.{}.{}; minichain\'s binding is '
                      'written for 3.2'.format(path, v.major, v.minor,
                                               v.patch))
    try:
        _declare(candidate)
    except AttributeError as e:
        raise OSError('{} lacks a call of oneDNN 3.2: {}'.format(path, e)
                      ) from None
    # oneDNN's threads are libgomp's; the same loaded copy answers here.
    gomp = ctypes.CDLL('libgomp.so.1')
    engine, stream = _handle(), _handle()
    check('dnnl_engine_create', candidate.dnnl_engine_create(
        ctypes.byref(engine), CPU, 0))
    check('dnnl_stream_create', candidate.dnnl_stream_create(
        ctypes.byref(stream), engine, STREAM_IN_ORDER))
    lib, _gomp = candidate, gomp
    return version()


def version():
    v = lib.dnnl_version().contents
    return '{}.{}.{}'.format(v.major, v.minor, v.patch)


def threads():
    """OpenMP's thread count: a primitive keeps the count it was created
    with, so it is part of every cache key (``OMP_NUM_THREADS`` sets it;
    the training script gives each rank cores / ranks)."""
    return _gomp.omp_get_max_threads()


def _declare(lib):
    """argtypes/restype of the calls used, so ctypes passes 64-bit
    pointers and checks the arity."""
    H, P, I, U = _handle, ctypes.POINTER(_handle), ctypes.c_int, ctypes.c_uint
    F, D = ctypes.c_float, Dims
    status = {
        'dnnl_engine_create': (P, I, ctypes.c_size_t),
        'dnnl_stream_create': (P, H, U),
        'dnnl_stream_wait': (H,),
        'dnnl_memory_desc_create_with_strides': (P, I, D, I, D),
        'dnnl_memory_desc_create_with_tag': (P, I, D, I, I),
        'dnnl_memory_desc_destroy': (H,),
        'dnnl_memory_create': (P, H, H, H),
        'dnnl_memory_set_data_handle': (H, H),
        'dnnl_memory_destroy': (H,),
        'dnnl_primitive_desc_destroy': (H,),
        'dnnl_primitive_create': (P, H),
        'dnnl_primitive_destroy': (H,),
        'dnnl_primitive_execute': (H, H, I, ctypes.POINTER(_ExecArg)),
        'dnnl_reorder_primitive_desc_create': (P, H, H, H, H, H),
        'dnnl_convolution_forward_primitive_desc_create':
            (P, H, I, I, H, H, H, H, D, D, D, D, H),
        'dnnl_convolution_backward_data_primitive_desc_create':
            (P, H, I, H, H, H, D, D, D, D, H, H),
        'dnnl_convolution_backward_weights_primitive_desc_create':
            (P, H, I, H, H, H, H, D, D, D, D, H, H),
        'dnnl_batch_normalization_forward_primitive_desc_create':
            (P, H, I, H, H, F, U, H),
        'dnnl_batch_normalization_backward_primitive_desc_create':
            (P, H, I, H, H, H, F, U, H, H),
        'dnnl_eltwise_forward_primitive_desc_create':
            (P, H, I, I, H, H, F, F, H),
        'dnnl_eltwise_backward_primitive_desc_create':
            (P, H, I, H, H, H, F, F, H, H),
        'dnnl_pooling_forward_primitive_desc_create':
            (P, H, I, I, H, H, D, D, D, D, D, H),
        'dnnl_pooling_backward_primitive_desc_create':
            (P, H, I, H, H, D, D, D, D, D, H, H),
        'dnnl_inner_product_forward_primitive_desc_create':
            (P, H, I, H, H, H, H, H),
        'dnnl_inner_product_backward_data_primitive_desc_create':
            (P, H, H, H, H, H, H),
        'dnnl_inner_product_backward_weights_primitive_desc_create':
            (P, H, H, H, H, H, H, H),
        'dnnl_binary_primitive_desc_create': (P, H, I, H, H, H, H),
        'dnnl_primitive_desc_query': (H, I, I, H),
        'dnnl_primitive_attr_create': (P,),
        'dnnl_primitive_attr_destroy': (H,),
        'dnnl_primitive_attr_set_scales_mask': (H, I, I),
        'dnnl_primitive_attr_set_post_ops': (H, H),
        'dnnl_post_ops_create': (P,),
        'dnnl_post_ops_destroy': (H,),
        'dnnl_post_ops_append_sum': (H, F, ctypes.c_int32, I),
        'dnnl_post_ops_append_eltwise': (H, I, F, F),
    }
    for name, args in status.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    lib.dnnl_primitive_desc_query_md.argtypes = (H, I, I)
    lib.dnnl_primitive_desc_query_md.restype = H
    lib.dnnl_memory_desc_equal.argtypes = (H, H)
    lib.dnnl_memory_desc_equal.restype = I
    lib.dnnl_memory_desc_get_size.argtypes = (H,)
    lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t


def check(call, status):
    if status != SUCCESS:
        raise Error(call, status)


def dims(values):
    d = Dims()
    for i, v in enumerate(values):
        d[i] = int(v)
    return d


# -- memory descriptors -------------------------------------------------------
class Owned:
    """A oneDNN object (``handle``) that this Python object owns: ctypes
    passes the handle, and the call named ``destroy`` destroys it with
    this object."""
    handle = None
    destroy = None

    @property
    def _as_parameter_(self):
        return self.handle

    def __del__(self):
        if lib is not None and self.handle:
            getattr(lib, self.destroy)(self.handle)


class Desc(Owned):
    """A memory descriptor that this object owns (destroyed with it)."""
    destroy = 'dnnl_memory_desc_destroy'

    def __init__(self, handle):
        self.handle = handle


def plain(shape, strides=None, dt=F32):
    """An md (f32 unless ``dt``) for an array of this shape and element
    strides (C order when None): NumPy's layout as oneDNN sees it."""
    if strides is None:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
    h = _handle()
    check('dnnl_memory_desc_create_with_strides',
          lib.dnnl_memory_desc_create_with_strides(
              ctypes.byref(h), len(shape), dims(shape), dt, dims(strides)))
    return Desc(h)


# NumPy's dtype name -> oneDNN's data type (bfloat16: ml_dtypes', the
# activations of mixed16 on the CPU)
DTS = {'float32': F32, 'bfloat16': BF16}


def dt_of(dtype):
    """oneDNN's data type of NumPy ``dtype``, or None (a big-endian float32
    is also named 'float32': native byte order only)."""
    return DTS.get(dtype.name) if dtype.isnative else None


def dtype_of(dt):
    """The NumPy dtype of oneDNN's data type ``dt`` (bfloat16: ml_dtypes',
    imported by whoever made a bfloat16 array)."""
    return numpy.dtype(next(name for name, v in DTS.items() if v == dt))


def describable(array):
    """Whether :func:`of` can describe ``array`` (float32 or bfloat16,
    strides positive and whole elements), checked without creating an md.
    """
    return dt_of(array.dtype) is not None and all(
        s > 0 and s % array.itemsize == 0 for s in array.strides)


def finite(array):
    """Whether every element of ``array`` is finite, in one pass: a sum
    is finite iff every term is (short of an overflow, which says no
    too: the kernel then declines, and the body runs). bfloat16 arrays
    are read as their bits (an exponent of all ones is inf or NaN):
    ml_dtypes' own sum took 36x as long (13.6 ms for 2.4M elements)."""
    if array.size and array.dtype.name == 'bfloat16':
        return int((array.view(numpy.uint16) & 0x7f80).max()) != 0x7f80
    return array.size == 0 or bool(numpy.isfinite(array.sum()))


def has_nan(array):
    """Whether a non-empty ``array`` holds a NaN, in one pass (bfloat16 by
    its bits, as :func:`finite`)."""
    if array.dtype.name == 'bfloat16':
        return int((array.view(numpy.uint16) & 0x7fff).max()) > 0x7f80
    return bool(numpy.isnan(array.max()))


def of(array):
    """The md of a float32 or bfloat16 NumPy array as it lies in memory
    (any positive strides), or None when oneDNN cannot describe it."""
    if not describable(array):
        return None
    return plain(array.shape, [s // array.itemsize for s in array.strides],
                 dt_of(array.dtype))


def channels_last(shape, dt=F32):
    """An md (f32 unless ``dt``) of an (N, C, H, W) tensor in NHWC memory:
    the layout the oneDNN kernels hand to NumPy (``_plan.py`` says why)."""
    n, c, h, w = shape
    return plain(shape, [h * w * c, 1, w * c, c], dt)


def empty_channels_last(shape, dtype=numpy.float32):
    """An uninitialized NumPy array of ``shape`` (N, C, H, W) over NHWC
    memory (PyTorch's ``channels_last``)."""
    n, c, h, w = shape
    return numpy.empty((n, h, w, c), dtype).transpose(0, 3, 1, 2)


def is_channels_last(array):
    """Whether ``array`` is a 4-D array over dense NHWC memory."""
    return (array.ndim == 4
            and array.transpose(0, 2, 3, 1).flags.c_contiguous)


def any_layout(shape, dt=F32):
    """An md (f32 unless ``dt``) whose layout the primitive picks
    (``format_tag_any``)."""
    h = _handle()
    check('dnnl_memory_desc_create_with_tag',
          lib.dnnl_memory_desc_create_with_tag(
              ctypes.byref(h), len(shape), dims(shape), dt, FORMAT_ANY))
    return Desc(h)


def same(md_a, md_b):
    return bool(lib.dnnl_memory_desc_equal(md_a, md_b))


def buffer(md):
    """A 64-byte aligned NumPy byte buffer holding one tensor of ``md``
    (oneDNN's kernels assume cache-line aligned data for full speed)."""
    n = lib.dnnl_memory_desc_get_size(md)
    raw = numpy.empty(n + 64, numpy.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + n]


# -- primitives ---------------------------------------------------------------
class PrimitiveDesc(Owned):
    """A primitive descriptor that this object owns, made by the call
    ``create`` (a ``dnnl_*_primitive_desc_create``) with ``args`` after the
    pointer it fills. Backward primitives take the forward's as a hint."""
    destroy = 'dnnl_primitive_desc_destroy'

    def __init__(self, create, *args):
        self.handle = _handle()
        check(create, getattr(lib, create)(ctypes.byref(self.handle), *args))
        if self.implementation().startswith('ref'):
            # oneDNN's reference code (a plain loop nest, for layouts its
            # optimized kernels do not take) ran a 1x1 convolution on a
            # channel-major input 1000x slower than NumPy: refuse it.
            raise Error(create + ' (only its reference implementation)', 3)

    def implementation(self):
        """oneDNN's name of the implementation chosen, e.g. 'jit:avx2'."""
        name = ctypes.c_char_p()
        check('dnnl_primitive_desc_query', lib.dnnl_primitive_desc_query(
            self.handle, QUERY_IMPL_INFO_STR, 0, ctypes.byref(name)))
        return name.value.decode()

    def md(self, arg):
        """The md the primitive descriptor chose for execute argument
        ``arg`` (a DNNL_ARG_*; owned by the pd)."""
        return lib.dnnl_primitive_desc_query_md(self.handle,
                                                QUERY_EXEC_ARG_MD, arg)


class Primitive:
    """A created primitive, its descriptor and a memory object for each
    execute argument ``args`` (DNNL_ARG_* values).

    The memory objects live as long as the primitive: oneDNN reads them
    during execute, and one freed while bound would crash the process.
    Each call points them at its arrays, which the caller holds until the
    call returns (execute on a CPU stream is finished after the wait); a
    lock keeps two Python threads from re-pointing them at once.
    """

    def __init__(self, pd, args, mds=None):
        self.pd = pd
        self.handle = _handle()
        check('dnnl_primitive_create',
              lib.dnnl_primitive_create(ctypes.byref(self.handle), pd))
        self.memory = {}
        mds = mds or {}   # args the pd has no md for (runtime scales)
        for arg in args:
            m = _handle()
            check('dnnl_memory_create', lib.dnnl_memory_create(
                ctypes.byref(m), mds.get(arg) or pd.md(arg), engine, None))
            self.memory[arg] = m
        self._args = (_ExecArg * len(args))(
            *[_ExecArg(a, m) for a, m in self.memory.items()])
        self._lock = threading.Lock()

    def md(self, arg):
        return self.pd.md(arg)

    def __call__(self, arrays):
        """Execute with ``{DNNL_ARG_*: NumPy array}`` (every argument)."""
        with self._lock:
            for arg, a in arrays.items():
                check('dnnl_memory_set_data_handle',
                      lib.dnnl_memory_set_data_handle(self.memory[arg],
                                                      a.ctypes.data))
            check('dnnl_primitive_execute', lib.dnnl_primitive_execute(
                self.handle, stream, len(self._args), self._args))
            check('dnnl_stream_wait', lib.dnnl_stream_wait(stream))

    def __del__(self):
        if lib is None:
            return
        for m in self.memory.values():
            lib.dnnl_memory_destroy(m)
        if self.handle:
            lib.dnnl_primitive_destroy(self.handle)


def reorder(src_md, dst_md):
    """A primitive copying a tensor from one layout to another."""
    pd = PrimitiveDesc('dnnl_reorder_primitive_desc_create', src_md, engine,
                       dst_md, engine, None)
    return Primitive(pd, (ARG_SRC, ARG_DST))
