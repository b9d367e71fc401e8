"""The CUDA kernels: CuPy ElementwiseKernels for the ops whose GPU version
differs from their plain CuPy body."""
