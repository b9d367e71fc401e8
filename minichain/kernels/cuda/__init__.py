"""The CUDA kernels: the GPU-shaped convolutions (``convolution.py``),
CuPy ElementwiseKernels (``_elementwise.py``) and
ReductionKernels for the ops whose GPU version differs from their plain
CuPy body, registered at import. The ops' bodies run on CuPy as they are;
these are faster (one thread per element instead of one CuPy call per
kernel offset) or hold no float16 sums."""
from minichain import backend, kernels
from minichain.configuration import fp32_math
from minichain.functions.basic_math import MatMul
from minichain.functions.linear import LinearFunction
from minichain.kernels.cuda import (  # noqa: F401  (they register)
    convolution, im2col, normalization, optimizers, pooling)
from minichain.kernels.cuda._gemm import matmul


def under_fp32_math(kernel):
    """``kernel`` with cuBLAS's float32 products in ``config.fp32_math``'s
    mode during the call: 'tf32' and 'bf16' on TF32 tensor cores, 'strict'
    as :func:`minichain.backend.set_tf32` left them. 'bf16' runs TF32
    (10 bits of mantissa, bfloat16's 8-bit exponent) because CuPy has no
    bfloat16 compute for float32 arrays: its GEMMs consult only TF32 and
    PEDANTIC (cupy/_core/_routines_linalg.pyx). cuBLAS's mode is the
    process's, hence set around the call and put back."""
    def run(node, inputs):
        if fp32_math() == 'strict' or backend.tf32_enabled():
            return kernel(node, inputs)
        backend.set_tf32(True)
        try:
            return kernel(node, inputs)
        finally:
            backend.set_tf32(False)
    run.__name__ = run.__qualname__ = kernel.__name__
    run.__wrapped__ = kernel
    return run


def products(node, inputs):
    """The body of a linear layer's product on CuPy: a kernel only so
    that :func:`under_fp32_math` wraps it."""
    return node.forward(inputs)


def matmul_nd(node, inputs):
    """``MatMul.forward``, a product of more than two dimensions in one
    cuBLAS call (``_gemm.py``: float16 on tensor cores)."""
    node.retain_inputs((0, 1))
    a, b = inputs
    return matmul(a, b).astype(a.dtype, copy=False),


# The convolution nodes: batched products that land in NCHW, no columns
# for a 1x1 layer (convolution.py).
convolution.register(lambda node_type, device, kernel: kernels.register(
    node_type, device, under_fp32_math(kernel)))
kernels.register(LinearFunction, 'cuda', under_fp32_math(products))
kernels.register(MatMul, 'cuda', under_fp32_math(matmul_nd))
