"""What the oneDNN kernels' checks for special values cost, against the
kernel they guard (issue 44): each kernel reads an array once more to
decline what oneDNN would compute otherwise than the body.

- ReLU's backward (batch normalization's relu, in every ResNet-50
  block): ``y.max()``, NaN when y holds NaN;
- max pooling: ``x.min()`` (NaN or -inf; the check it replaced was
  ``isnan(x).any()``) and ``gy.sum()`` (not finite);
- a padded convolution: ``W.sum()`` before the forward, ``gy.sum()``
  before the backward weights.

Best of 9 repeats of 10 calls each, in ms, at the main job's shapes
(32 x 28, small2) and the stem's at 224:

    OMP_WAIT_POLICY=passive python bench/onednn_checks.py
"""
import os
import sys
import time
import timeit

import numpy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
from minichain.functions import activation as A  # noqa: E402
from minichain.functions import convolution as C  # noqa: E402
from minichain.functions import pooling as P  # noqa: E402
from minichain.kernels.onednn import _dnnl  # noqa: E402
from minichain.kernels.onednn import activation, convolution, pooling  # noqa: E402,E501


def ms(f):
    return min(timeit.repeat(f, number=10, repeat=9)) / 10 * 1e3


def channels_last(a):
    return numpy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(
        0, 3, 1, 2)


def main():
    _dnnl.load()
    rng = numpy.random.default_rng(0)
    print('{}, {} oneDNN threads, {}'.format(
        os.environ.get('BENCH_CPU', 'CPU?'), _dnnl.threads(),
        time.strftime('%Y-%m-%d %H:%M')))
    for s in [(32, 64, 14, 14), (32, 256, 14, 14), (32, 512, 7, 7),
              (32, 1024, 4, 4), (32, 2048, 2, 2), (8, 64, 112, 112)]:
        y = channels_last(numpy.abs(rng.standard_normal(s)).astype('f4'))
        gy = channels_last(rng.standard_normal(s).astype('f4'))
        k = ms(lambda: activation.relu_grad(A.ReLUGrad(), (y, gy)))
        c = ms(lambda: y.max())
        print('relu bwd {}: kernel {:.3f}, y.max() {:.3f} ({:.0%})'.format(
            'x'.join(map(str, s)), k, c, c / k))
    x = channels_last(rng.standard_normal((8, 64, 112, 112)).astype('f4'))
    g = P._pool_geometry('max_pooling_2d', x, 3, 2, 1, False)
    node = P.MaxPooling2D(g)
    y, = pooling.max_pooling_2d(node, (x,))
    gy = numpy.ones_like(y)
    print('max pooling 8x64x112x112 fwd {:.3f}: x.min() {:.3f}, '
          'isnan(x).any() {:.3f}; bwd {:.3f}: gy.sum() {:.3f}'.format(
              ms(lambda: pooling.max_pooling_2d(P.MaxPooling2D(g), (x,))),
              ms(lambda: x.min()), ms(lambda: numpy.isnan(x).any()),
              ms(lambda: pooling.max_pooling_2d_grad(
                  P.MaxPooling2DGrad(g, node.indexes), (gy,))),
              ms(lambda: gy.sum())))
    one = (1, 1)
    for n, c, h in [(32, 64, 14), (32, 128, 7), (32, 256, 4)]:
        x = channels_last(rng.standard_normal((n, c, h, h)).astype('f4'))
        W = rng.standard_normal((c, c, 3, 3)).astype('f4')
        y, = convolution.convolution_2d(
            C.Convolution2D(one, one, False, one, 1), (x, W))
        print('3x3 conv {}x{}x{}: fwd {:.3f}, W.sum() {:.3f}; grad W {:.3f},'
              ' gy.sum() {:.3f}'.format(
                  n, c, h, ms(lambda: convolution.convolution_2d(
                      C.Convolution2D(one, one, False, one, 1), (x, W))),
                  ms(lambda: W.sum()),
                  ms(lambda: convolution.convolution_2d_grad_w(
                      C.Convolution2DGradW(W.shape, one, one, False, one, 1),
                      (x, y))),
                  ms(lambda: y.sum())))


if __name__ == '__main__':
    main()
