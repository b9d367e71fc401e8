"""The CUDA kernels: CuPy ElementwiseKernels (``_elementwise.py``) and
ReductionKernels for the ops whose GPU version differs from their plain
CuPy body, registered at import. The ops' bodies run on CuPy as they are;
these are faster (one thread per element instead of one CuPy call per
kernel offset) or hold no float16 sums."""
from minichain.kernels.cuda import (  # noqa: F401  (they register)
    im2col, normalization, pooling)
