"""The oneDNN kernels of the small ops against the NumPy kernels, in
interleaved pairs: ReLU, the sum of two gradients (Add), max and average
pooling, global average pooling and linear, at the shapes ResNet-50 gives them (batch 32 at the small2
maps, batch 8 at 224), and the convolution's weight reorders.

For each case both kernels run forward and backward as one turn; each
pair runs the two in alternating order, one right after the other, so
that the machine's drift touches them alike. The figure is the median over
pairs of NumPy time / oneDNN time (above 1: oneDNN faster), with the
pairs' quartiles (the middle half of the ratios): a difference inside
that spread is no difference. These are the figures that decide which
oneDNN kernels ``minichain/kernels/onednn/__init__.py`` registers.

    OMP_WAIT_POLICY=passive python bench/onednn_ops.py [--pairs 15]
"""
import argparse
import os
import sys
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
from minichain import kernels  # noqa: E402
from minichain.functions import activation as A  # noqa: E402
from minichain.functions import basic_math as M  # noqa: E402
from minichain.functions import pooling as P  # noqa: E402
from minichain.functions.linear import LinearFunction  # noqa: E402

# activations: (batch, channels, map) after the stem and each stage
MAPS = [(32, 64, 14), (32, 256, 14), (32, 512, 7), (32, 1024, 4),
        (32, 2048, 2), (8, 64, 112), (8, 256, 56)]
GAPS = [(32, 2048, 2), (32, 2048, 4), (8, 2048, 7)]
LINEARS = [(32, 2048, 10), (8, 2048, 1000)]   # (batch, in, out)


def _numpy(node_type):
    """The NumPy kernel, or the body where there is none."""
    kernel = kernels.registered(node_type, 'numpy')
    return kernel or (lambda node, inputs: node.forward(inputs))


def _pairs(a, b, n, times=None):
    """Median and quartiles of time(a) / time(b) over n pairs; with
    ``times`` (a dict), each turn's seconds are also appended to its
    lists ``'a'`` and ``'b'``."""
    a(), b()   # primitives built, memory touched
    ratios = []
    for i in range(n):
        turn = {}
        for name, fn in ((('a', a), ('b', b)) if i % 2 else
                         (('b', b), ('a', a))):
            start = time.perf_counter()
            fn()
            turn[name] = time.perf_counter() - start
            if times is not None:
                times.setdefault(name, []).append(turn[name])
        ratios.append(turn['a'] / turn['b'])
    return tuple(float(q) for q in numpy.percentile(ratios, (50, 25, 75)))


def _cases(onednn, rng):
    """(label, numpy turn, oneDNN turn) for every case."""
    K = onednn
    f32 = numpy.float32

    def rand(*shape):
        return rng.standard_normal(shape, dtype=f32)

    def relu_turn(pair, x, gy):
        fwd, bwd = pair
        y, = fwd(A.ReLU(), (x,))
        bwd(A.ReLUGrad(), (y, gy))
    for n, c, h in MAPS:
        x, gy = rand(n, c, h, h), rand(n, c, h, h)
        pairs = [(_numpy(A.ReLU), _numpy(A.ReLUGrad)),
                 (K.activation.relu, K.activation.relu_grad)]
        yield ('relu fwd+bwd {}x{}x{}^2'.format(n, c, h),
               *(lambda p=p, x=x, gy=gy: relu_turn(p, x, gy)
                 for p in pairs))

    def last(a):   # channels-last, as the oneDNN kernels' gradients lie
        return numpy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(
            0, 3, 1, 2)
    threshold, K._binary._MIN_ADD = K._binary._MIN_ADD, 1  # where it pays
    for n, c, h in MAPS + [(8, 64, 24), (8, 64, 16), (8, 64, 8)]:
        a, b = last(rand(n, c, h, h)), last(rand(n, c, h, h))
        yield ('add {}x{}x{}^2'.format(n, c, h),
               lambda a=a, b=b: _numpy(M.Add)(M.Add(), (a, b)),
               lambda a=a, b=b: K._binary.add(M.Add(), (a, b)))
    K._binary._MIN_ADD = threshold

    def pool_turn(kinds, g, x, gy):
        fwd, bwd = kinds
        if fwd[0] is P.MaxPooling2D:
            node = fwd[0](g)
            fwd[1](node, (x,))
            bwd[1](bwd[0](g, node.indexes), (gy,))
        else:
            fwd[1](fwd[0](g), (x,))
            bwd[1](bwd[0](g), (gy,))
    x = rand(8, 64, 112, 112)
    for label, fwd_t, bwd_t, k_fwd, k_bwd, cover in (
            ('max', P.MaxPooling2D, P.MaxPooling2DGrad,
             K.pooling.max_pooling_2d, K.pooling.max_pooling_2d_grad,
             False),
            ('average', P.AveragePooling2D, P.AveragePooling2DGrad,
             K.pooling.average_pooling_2d,
             K.pooling.average_pooling_2d_grad, False)):
        g = P._pool_geometry(label, x, 3, 2, 1, cover)
        gy = rand(8, 64, g.oh, g.ow)
        yield ('{} pool 3x3/2 fwd+bwd 8x64x112^2'.format(label),
               lambda: pool_turn(((fwd_t, _numpy(fwd_t)),
                                  (bwd_t, _numpy(bwd_t))), g, x, gy),
               lambda: pool_turn(((fwd_t, k_fwd), (bwd_t, k_bwd)), g, x,
                                 gy))
    for n, c, h in GAPS:
        x = rand(n, c, h, h)
        yield ('global avg pool fwd {}x{}x{}^2'.format(n, c, h),
               lambda x=x: _numpy(P.GlobalAveragePooling2D)(
                   P.GlobalAveragePooling2D(), (x,)),
               lambda x=x: K.pooling.global_average_pooling_2d(
                   P.GlobalAveragePooling2D(), (x,)))

    def linear_turn(fwd, mm, x, W, b, gy):
        fwd(LinearFunction(), (x, W, b))
        mm(M.MatMul(), (gy, W))
        mm(M.MatMul(), (gy.T, x))
    for n, i, o in LINEARS:
        x, W, b, gy = rand(n, i), rand(o, i), rand(o), rand(n, o)
        yield ('linear fwd+bwd {}x{}->{}'.format(n, i, o),
               lambda x=x, W=W, b=b, gy=gy: linear_turn(
                   _numpy(LinearFunction), _numpy(M.MatMul), x, W, b, gy),
               lambda x=x, W=W, b=b, gy=gy: linear_turn(
                   K.linear.linear, K.linear.matmul, x, W, b, gy))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--pairs', type=int, default=15)
    parser.add_argument('--only', help='run the cases whose label holds this')
    args = parser.parse_args()
    from minichain.kernels import onednn
    if not onednn.available():
        sys.exit('onednn_ops: oneDNN is not installed: {}'.format(
            onednn._load_error))
    import platform
    model = next((line.split(':', 1)[1].strip() for line in open(
        '/proc/cpuinfo') if line.startswith('model name')),
        platform.processor())
    print('{}, {} oneDNN threads, OMP_WAIT_POLICY={}, {}'.format(
        model, onednn._dnnl.threads(), os.environ.get('OMP_WAIT_POLICY', ''),
        time.strftime('%Y-%m-%d %H:%M')))
    print('{:<40} {:>8} {:>15}'.format('case', 'NumPy/oneDNN', 'quartiles'))
    rng = numpy.random.default_rng(0)
    for label, numpy_turn, onednn_turn in _cases(onednn, rng):
        if args.only and args.only not in label:
            continue
        med, low, high = _pairs(numpy_turn, onednn_turn, args.pairs)
        print('{:<40} {:>11.2f}x {:>7.2f}-{:.2f}'.format(label, med, low,
                                                          high), flush=True)


if __name__ == '__main__':
    main()
