"""The CUDA kernels: the GPU-shaped convolutions (``convolution.py``),
CuPy ElementwiseKernels (``_elementwise.py``) and
ReductionKernels for the ops whose GPU version differs from their plain
CuPy body, registered at import. The ops' bodies run on CuPy as they are;
these are faster (one thread per element instead of one CuPy call per
kernel offset) or hold no float16 sums."""
from minichain import kernels
from minichain.kernels.cuda import (  # noqa: F401  (they register)
    convolution, im2col, normalization, pooling)

# The convolution nodes: batched products that land in NCHW, no columns
# for a 1x1 layer (convolution.py).
convolution.register(kernels.register)
