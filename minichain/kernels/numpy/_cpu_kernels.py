"""CPU kernels: the products, on minichain's threads.

A kernel computes the same values as the plain NumPy expression of its
op's body: it only cuts the arrays into row blocks and runs the blocks on
several threads (``_parallel.py``; how many: the BLAS's count, see
:mod:`minichain.host`), with no temporaries beyond the output. The
products (``MatMul``, ``linear``) come here so that the BLAS runs on one
thread while minichain's threads share the product out.

Retired (issue 27, item 5: a kernel stays if the main job's step without
it is at least 5% slower; bench/README.md, "What each NumPy kernel
gives"): the elementwise kernels of Add (the step without it 1.00x on the
NumPy path twice, 1.01x with oneDNN) and of ReLU and its gradient (1.01-
1.08x; ResNet-50 has no ReLU outside batch normalization), and
MomentumSGD's update on threads with BLAS's axpby and axpy called through
ctypes (1.05x, 0.98x, 1.00x on the NumPy path, 0.99x with oneDNN).
"""
from minichain import host
from minichain.kernels.numpy import _parallel


@host.cpu_kernel
def matmul(a, b, out=None):
    """``a @ b`` (NumPy's rules), large products cut into row blocks."""
    return _parallel.matmul(a, b, out=out)
