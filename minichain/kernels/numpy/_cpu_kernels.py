"""CPU kernels: the fast NumPy versions of a few ops, on minichain's threads.

An op states its mathematics in its own body (``Add.forward`` returns
``a + b``) and calls a kernel here when its arrays fit one (:func:`fits`),
as Chainer's ops keep a ``forward_cpu`` beside the ``forward_gpu`` that
``_cuda_kernels.py`` serves. A kernel computes the same values as the
plain NumPy expression: it only cuts the arrays into row blocks and runs
the blocks on several threads (``_parallel.py``; how many: the BLAS's
count, see :mod:`minichain.host`), with no temporaries beyond the output.

Why these ops and not Sub, Mul or Div: NumPy runs a ufunc on one core, so
the elementwise passes over a ResNet-50 step's activations (about a sixth
of a step) stay serial unless split. The passes over whole activations are
the residual additions (and the gradient sums, ``x.grad + gx``), ReLU and
its gradient, batch normalization (``_normalization_kernels.py``) and the
optimizer's update; ``bench/op_profile.py`` lists the time per op. Sub,
Mul and Div meet small arrays there (per-channel statistics, the loss),
where handing blocks to threads costs more than it saves, so they stay one
NumPy call each; one of them would get a kernel here the same way when a
model spends its time in it. The products (``MatMul``, ``linear``) come
here too, so that the BLAS runs on one thread while minichain's threads
share the product out.
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
def add(a, b):
    """``a + b`` (one shape and dtype) into a fresh array."""
    return _parallel.elementwise(lambda o, u, v: numpy.add(u, v, out=o),
                                 _layout.empty_like_dense(a, b), a, b)


@host.cpu_kernel
def relu(x):
    """``max(x, 0)`` into a fresh array."""
    zero = x.dtype.type(0)
    return _parallel.elementwise(lambda o, a: numpy.maximum(a, zero, out=o),
                                 _layout.empty_like_dense(x), x)


def _relu_grad_block(out, y, gy):
    # The mask lands in out as 0/1 and is scaled in place: no bool temporary
    # and no mixed-type multiply.
    numpy.greater(y, 0, out=out)
    numpy.multiply(out, gy, out=out)


@host.cpu_kernel
def relu_grad(y, gy):
    """``gy * (y > 0)`` into a fresh array."""
    return _parallel.elementwise(_relu_grad_block,
                                 _layout.empty_like_dense(y, gy), y, gy)


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
