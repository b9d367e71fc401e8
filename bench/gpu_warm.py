"""Compile the GPU kernels once, before the timed and tested stages.

CuPy compiles every kernel with NVRTC at its first launch (about 0.25 s
each on a fresh machine) and keeps it in its on-disk cache
(``~/.cupy/kernel_cache``, or ``CUPY_CACHE_DIR``), which every later
process reads. bench/gpu_check.sh runs this once, so that the NCCL, test
and training stages spend their time limits on what they check, not on
NVRTC. It runs a small network's forward, backward and update in float16,
float32 and float64 (convolutions 3x3, strided and 1x1, their gradients,
batch normalization with a fused residual, max and average pooling, a
linear layer, the loss), which launches every minichain kernel and the
CuPy kernels those ops use.

    python bench/gpu_warm.py [--device gpu|cpu]

``--device cpu`` runs the same ops on NumPy: a dry run without a GPU.
"""
import argparse
import os
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from minichain import Variable, backend  # noqa: E402
from minichain import functions as F  # noqa: E402
from minichain import optimizers  # noqa: E402
from minichain import links as L  # noqa: E402


def step(xp, dtype):
    """One forward, backward (to second order for the pooling gather) and
    update in ``dtype``."""
    rng = numpy.random.default_rng(0)

    def param(*shape):
        return Variable(xp.asarray(rng.standard_normal(shape) * 0.1,
                                   dtype=dtype))
    x = Variable(xp.asarray(rng.standard_normal((4, 3, 16, 16)),
                            dtype=dtype))
    t = xp.asarray(rng.integers(0, 5, 4), dtype=numpy.int32)
    w3, w1, w2 = param(8, 3, 3, 3), param(8, 8, 1, 1), param(8, 8, 3, 3)
    gamma, beta = param(8), param(8)
    h = F.convolution_2d(x, w3, pad=1)
    h = F.batch_normalization(h, gamma, beta, residual=F.convolution_2d(
        h, w1), relu=True)
    h = F.max_pooling_2d(h, 3, 2, 1)
    h = F.convolution_2d(h, w2, stride=2, pad=1)   # col2im in its gx
    h = F.reshape(F.average_pooling_2d(F.relu(h), 2), (4, -1))
    wl, bl = param(5, h.shape[1]), param(5)
    y = F.linear(h, wl, bl)
    loss = F.softmax_cross_entropy(y, t) + F.sum(
        F.deconvolution_2d(x, F.transpose(w3, (1, 0, 2, 3)), stride=2) ** 2)
    loss.backward(enable_double_backprop=True)
    F.sum(x.grad_var * x.grad_var).backward()      # second order
    model = L.Linear(h.shape[1], 5)
    model.W.array = xp.asarray(wl.array)
    model.b.array = xp.asarray(bl.array)
    opt = optimizers.MomentumSGD(lr=0.1).setup(model)
    opt.update(lambda: F.sum(model(h.array) ** 2))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', choices=('gpu', 'cpu'), default='gpu')
    args = p.parse_args()
    xp = numpy
    if args.device == 'gpu':
        xp = backend.get_cupy()
    for dtype in ('float16', 'float32', 'float64'):
        start = time.perf_counter()
        step(xp, numpy.dtype(dtype))
        if xp is not numpy:
            xp.cuda.Device().synchronize()
        print('gpu_warm: {} step, first launch: {:.1f} s'.format(
            dtype, time.perf_counter() - start), flush=True)


if __name__ == '__main__':
    main()
