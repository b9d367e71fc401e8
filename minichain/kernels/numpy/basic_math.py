"""Add (arrays of one shape) split over minichain's threads, and MatMul
with the BLAS on one thread while minichain's threads share the product
out (``_cpu_kernels.py`` says why these ops and not Sub, Mul or Div)."""
import numpy

from minichain import kernels
from minichain.functions.basic_math import Add, MatMul
from minichain.kernels.numpy import _cpu_kernels


def add(node, inputs):
    a, b = inputs
    if not _cpu_kernels.fits(a, b):
        return None  # broadcasting or mixed dtypes: the body
    node.shapes = (a.shape, b.shape)
    return _cpu_kernels.add(a, b),


def matmul(node, inputs):
    a, b = inputs
    if not (isinstance(a, numpy.ndarray) and isinstance(b, numpy.ndarray)):
        return None
    node.retain_inputs((0, 1))
    return _cpu_kernels.matmul(a, b),


kernels.register(Add, 'numpy', add)
kernels.register(MatMul, 'numpy', matmul)
