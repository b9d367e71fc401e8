"""MatMul with the BLAS on one thread while minichain's threads share
the product out (``_cpu_kernels.py``)."""
import numpy

from minichain import kernels
from minichain.functions.basic_math import MatMul
from minichain.kernels.numpy import _cpu_kernels


def matmul(node, inputs):
    a, b = inputs
    if not (isinstance(a, numpy.ndarray) and isinstance(b, numpy.ndarray)
            ) or a.dtype.kind == 'V':  # ml_dtypes' bfloat16: the body's
        return None
    node.retain_inputs((0, 1))
    return _cpu_kernels.matmul(a, b),


kernels.register(MatMul, 'numpy', matmul)
