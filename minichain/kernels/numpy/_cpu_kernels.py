"""CPU kernels: the products and the optimizer's update, on minichain's
threads.

A kernel computes the same values as the plain NumPy expression of its
op's body: it only cuts the arrays into row blocks and runs the blocks on
several threads (``_parallel.py``; how many: the BLAS's count, see
:mod:`minichain.host`), with no temporaries beyond the output. The
products (``MatMul``, ``linear``) come here so that the BLAS runs on one
thread while minichain's threads share the product out; MomentumSGD's
update, so that its passes over all parameters run on every core.

Elementwise kernels for Add, ReLU and ReLU's gradient (the same row
blocks on threads) were retired: at the main job's shape the step without
Add's measured 1.00x on the NumPy path (twice) and 1.01x with oneDNN,
without ReLU's gradient's 1.01-1.08x and 1.03x, and ResNet-50 has no ReLU
outside batch normalization, against the 5% of a step a kernel must give
(issue 27; bench/README.md, "What each NumPy kernel gives").
"""
import numpy

from minichain import host
from minichain.kernels.numpy import _blas, _layout, _parallel


def fits(*arrays):
    """True when every array is a NumPy array of one shape and dtype: what
    the elementwise kernels here take (any strides; their outputs keep the
    inputs' memory layout, see ``_layout.py``)."""
    a = arrays[0]
    return all(isinstance(b, numpy.ndarray) and b.shape == a.shape
               and b.dtype == a.dtype for b in arrays)


@host.cpu_kernel
def matmul(a, b, out=None):
    """``a @ b`` (NumPy's rules), large products cut into row blocks."""
    return _parallel.matmul(a, b, out=out)


@host.cpu_kernel
def momentum_sgd(param, v, grad, tmp, lr, momentum):
    """In place: ``v = momentum * v - lr * grad``, then ``param += v``
    (``tmp`` is scratch of grad's shape).

    A kernel like the ops' ones, although the update runs outside any op:
    split over two threads, its passes over ResNet-50's 25.5 million
    parameters took 42 ms per step against 71 ms on one (2-core machine,
    2026-12-01). Where the BLAS can be called directly
    (``_blas.py``) each block is its axpby and axpy, two passes instead
    of four, with the same values up to rounding and the same on any
    number of threads: 42 ms against 54 ms for the NumPy passes, on two
    threads, each measured twice, alternately (2026-12-01, evening).
    """
    def block(p, v, g, t):
        if _blas.axpby(-lr, g, momentum, v):  # v = momentum * v - lr * g
            if not _blas.axpy(1.0, v, p):
                p += v
            return
        numpy.multiply(v, momentum, out=v)
        v -= numpy.multiply(g, lr, out=t)
        p += v
    _parallel.elementwise(block, param, v, grad, tmp)
