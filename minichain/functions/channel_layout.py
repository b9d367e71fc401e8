"""Where the channels of a batch-normalized array are: :class:`Layout`.

Batch normalization reduces some axes of ``x`` (the batch and the spatial
ones) and keeps the others (the channels); its body, its kernels and the
multi-node version all describe ``x`` by one Layout.
"""
import numpy

from minichain.utils import size_of_shape


class Layout:
    """Where the channels of ``x`` are, given the reduced ``axes``.

    Attributes:
        axes: sorted tuple of reduced axes.
        cshape: the channel shape (the shape of gamma).
        bshape: ``x.shape`` with 1 on reduced axes (broadcasts channels).
        m: number of elements per channel.
        view: ``(P, C, L)`` when the channel axes form one contiguous block,
            so that a C-contiguous ``x`` reshapes to it without a copy;
            else None.
    """

    def __init__(self, shape, axes):
        self.shape, self.axes = tuple(shape), tuple(axes)
        kept = [i for i in range(len(shape)) if i not in axes]
        self.cshape = tuple(shape[i] for i in kept)
        self.bshape = tuple(1 if i in axes else s for i, s in enumerate(shape))
        csize = size_of_shape(self.cshape)
        self.m = size_of_shape(shape) // csize if csize else 0
        self.view = None
        if kept and kept == list(range(kept[0], kept[-1] + 1)):
            self.view = (size_of_shape(shape[:kept[0]]), csize,
                         size_of_shape(shape[kept[-1] + 1:]))


def acc_dtype(dtype):
    """The dtype of the statistics and sums for inputs of ``dtype``: 16-bit
    floats (float16, ml_dtypes' bfloat16) are accumulated and kept in
    float32 (as Chainer and cuDNN do; a per-channel sum of 200k values
    near 1 overflows float16, and bfloat16 keeps 8 bits of it)."""
    dtype = numpy.dtype(dtype)
    return numpy.dtype(numpy.float32) if dtype.itemsize < 4 else dtype
