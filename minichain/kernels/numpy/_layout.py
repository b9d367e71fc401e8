"""Memory layouts of the CPU activations: NCHW shapes, channel-major memory.

Every array an op sees has the logical shape (N, C, H, W) (Chainer's), but
on the CPU the convolutions write their outputs *channel-major*: the
memory of a C-contiguous (C, N, H, W) array, seen through its transpose
(as PyTorch's ``channels_last`` is an NCHW tensor over NHWC memory). Why:
a convolution is a product over the channels, ``W (O, C) @ x (C, N*H*W)``.
With x channel-major, a 1x1 convolution, its input gradient and its weight
gradient are each one matrix product that BLAS reads and writes in place,
where NCHW memory needs a transposition of x before the product and of y
after it whenever a product spans several images (at 14x14 and smaller
every product does, to have enough columns). Batch normalization then
reduces each channel over one contiguous row of N*H*W values.

NumPy keeps the layout through elementwise ops (a ufunc's output follows
its inputs' memory order), so ReLU, the residual additions and batch
normalization pass it on; every op still accepts any strides, only faster
for these two layouts. CuPy arrays stay C-contiguous (cuBLAS multiplies
the whole batch at once there).
"""
import numpy


def native(arrays):
    """Whether ``arrays`` are all NumPy arrays of NumPy's own number types
    in the machine's byte order, which the NumPy kernels take: the body
    runs the others (a big-endian array, as an IDX file holds, would make
    some kernels return big-endian results, or fail; ml_dtypes' bfloat16,
    of kind 'V', has no BLAS)."""
    return all(isinstance(a, numpy.ndarray) and a.dtype.isnative
               and a.dtype.kind != 'V' for a in arrays)


def channel_major(a):
    """The C-contiguous (C, N, ...) array behind ``a`` (N, C, ...) when
    ``a`` is a channel-major NumPy array, else None."""
    if not isinstance(a, numpy.ndarray) or a.ndim < 2:
        return None
    t = a.swapaxes(0, 1)
    return t if t.flags.c_contiguous else None


def empty_channel_major(shape, dtype):
    """An uninitialized NumPy array of ``shape`` (N, C, ...) in
    channel-major memory."""
    shape = tuple(shape)
    return numpy.empty((shape[1], shape[0]) + shape[2:], dtype).swapaxes(0, 1)


def zeros_channel_major(shape, dtype):
    """Zeros of ``shape`` (N, C, ...) in channel-major memory."""
    shape = tuple(shape)
    return numpy.zeros((shape[1], shape[0]) + shape[2:], dtype).swapaxes(0, 1)


def dense_order(a):
    """The axes of ``a`` from the largest stride to the smallest when its
    memory is one dense block in that order (``a.transpose(order)`` is
    C-contiguous), else None. Broadcast views (zero strides) have none."""
    order = tuple(sorted(range(a.ndim), key=lambda i: -a.strides[i]))
    return order if a.transpose(order).flags.c_contiguous else None


def flat_views(out, *arrays):
    """1-D views of ``out`` and ``arrays`` over their memory, when all of
    them are dense in one and the same order (an elementwise op on them is
    then one pass over flat memory); None otherwise."""
    if out.ndim == 0:
        return None
    order = dense_order(out)
    if order is None or any(a.shape != out.shape or a.strides != out.strides
                            for a in arrays):
        return None
    return [a.transpose(order).reshape(-1) for a in (out,) + arrays]


def empty_like_dense(*arrays):
    """An uninitialized array like the first of ``arrays`` that is dense
    (C-contiguous, channel-major...), so that an elementwise op's output
    keeps the layout of its inputs and never copies a broadcast view's
    strides; C-contiguous when none is dense."""
    for a in arrays:
        if dense_order(a) is not None:
            return numpy.empty_like(a)
    return numpy.empty(arrays[0].shape, arrays[0].dtype)
