"""The oneDNN kernels one layer at a time against the ops' bodies.

For each ResNet-50 layer kind at batch 32 (small2 and ImageNet maps):
a convolution's forward + backward data + backward weights, and batch
normalization's forward (ReLU fused) + backward, and its inference-mode
forward (an evaluation's), timed as oneDNN kernel
(``minichain/kernels/onednn``) and as the op's body (``node.forward``)
in alternation, the median of ``--reps`` turns each; the ratio is body
time / oneDNN time (above 1: oneDNN faster). Inputs are channels-last,
as the kernels hand them to each other. A convolution is also timed with
its primitive forced onto NHWC and forced into the blocked layout, which
is how ``_NHWC_MIN_PIXELS`` in ``onednn/convolution.py`` was chosen.
Batch normalization is also timed as the NumPy kernel on channel-major
arrays (what the NumPy path runs) and on NCHW ones (what ran beside the
oneDNN convolutions before they returned channels-last). These are the
figures behind the sizes the kernels decline (bench/README.md, "oneDNN
kernels").

    OMP_WAIT_POLICY=passive python bench/onednn_layers.py [--reps 7]
        [--bn-only | --evaluation PAIRS]
"""
import argparse
import os
import sys
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
from minichain.functions import convolution as C  # noqa: E402
from minichain.functions import normalization as N  # noqa: E402
from minichain.functions.channel_layout import Layout  # noqa: E402

# (batch, in channels, map, out channels, kernel, stride, pad)
CONVS = [(32, 64, 14, 64, 3, 1, 1), (32, 128, 7, 128, 3, 1, 1),
         (32, 256, 4, 256, 3, 1, 1), (32, 512, 2, 512, 3, 1, 1),
         (32, 256, 14, 64, 1, 1, 0), (32, 64, 14, 256, 1, 1, 0),
         (32, 512, 4, 128, 1, 1, 0), (32, 1024, 4, 2048, 1, 2, 0),
         (32, 2048, 2, 512, 1, 1, 0), (32, 1, 28, 64, 3, 2, 1),
         (8, 3, 224, 64, 7, 2, 3), (8, 64, 56, 64, 3, 1, 1)]
BNS = [(32, 64, 14), (32, 256, 14), (32, 128, 7), (32, 512, 7), (32, 256, 4),
       (32, 1024, 4), (32, 512, 2), (32, 2048, 2), (8, 64, 112), (8, 256, 56)]


def _median_ms(fn, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * float(numpy.median(times))


def _conv_step(kernels, x, W, gy, s, p):
    fwd, bwd_data, bwd_w = kernels
    fwd(C.Convolution2D((s, s), (p, p), False, (1, 1), 1), (x, W))
    bwd_data(C.Deconvolution2D((s, s), (p, p), x.shape[2:], False, (1, 1),
                               1), (gy, W))
    bwd_w(C.Convolution2DGradW(W.shape, (s, s), (p, p), False, (1, 1), 1),
          (x, gy))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--reps', type=int, default=7)
    parser.add_argument('--bn-only', action='store_true',
                        help='batch normalization only')
    parser.add_argument('--evaluation', type=int, metavar='PAIRS',
                        help="only make train's evaluation forward with "
                        'and without the inference batch-norm kernel, in '
                        'PAIRS interleaved pairs')
    args = parser.parse_args()
    from minichain.kernels import onednn
    if not onednn.available():
        sys.exit('onednn_layers: oneDNN is not installed: {}'.format(
            onednn._load_error))
    if args.evaluation:
        return _evaluation(onednn, args.evaluation)
    K, plan = onednn.convolution, onednn._plan

    def body(node, inputs):
        return node.forward(inputs)
    bodies = (body,) * 3
    kernels = (K.convolution_2d, K.deconvolution_2d, K.convolution_2d_grad_w)
    # Every size, whatever the decline rules say: this measures them.
    K._MIN_PIXELS = 1
    rng = numpy.random.default_rng(0)
    print('threads {} (OMP_NUM_THREADS), OMP_WAIT_POLICY={}; ms per '
          'fwd + bwd data + bwd weights'.format(
              onednn._dnnl.threads(), os.environ.get('OMP_WAIT_POLICY', '')))
    print('{:<28} {:>8} {:>8} {:>8} {:>8} {:>7}'.format(
        'convolution n,c,h,o,k,s,p', 'body', 'oneDNN', 'nhwc', 'blocked',
        'ratio'))
    rule, last = K._NHWC_MIN_PIXELS, onednn._dnnl.empty_channels_last

    def channels_last(a):
        b = last(a.shape)
        b[...] = a
        return b
    for n, c, h, o, k, s, p in ([] if args.bn_only else CONVS):
        x = channels_last(rng.standard_normal((n, c, h, h),
                                              dtype=numpy.float32))
        W = rng.standard_normal((o, c, k, k), dtype=numpy.float32)
        oh = (h + 2 * p - k) // s + 1
        gy = channels_last(rng.standard_normal((n, o, oh, oh),
                                               dtype=numpy.float32))
        t = {}
        for name, threshold in (('oneDNN', rule), ('nhwc', 0),
                                ('blocked', 10 ** 9)):
            if k == 1 and name != 'oneDNN':
                continue   # 1x1 always runs on NHWC
            K._NHWC_MIN_PIXELS = threshold
            plan._cache.clear()
            _conv_step(kernels, x, W, gy, s, p)     # build the primitives
            t[name] = _median_ms(lambda: _conv_step(kernels, x, W, gy, s,
                                                    p), args.reps)
        K._NHWC_MIN_PIXELS = rule
        t['body'] = _median_ms(lambda: _conv_step(bodies, x, W, gy, s, p),
                               max(3, args.reps // 2))
        print('{:<28} {:>8.2f} {:>8.2f} {:>8} {:>8} {:>6.2f}x'.format(
            ','.join(map(str, (n, c, h, o, k, s, p))), t['body'],
            t['oneDNN'], *('{:.2f}'.format(t[m]) if m in t else '-'
                           for m in ('nhwc', 'blocked')),
            t['body'] / t['oneDNN']))
    print('{:<28} {:>8} {:>8} {:>8} {:>8} {:>16}'.format(
        'batch norm + relu n,c,h', 'body', 'NumPy', 'on NCHW', 'oneDNN',
        'NumPy / oneDNN'))
    from minichain.kernels.numpy import normalization as numpy_bn
    bn, bn_grad = onednn.normalization.batch_normalization, \
        onednn.normalization.batch_normalization_grad
    for n, c, h in BNS:
        nchw = rng.standard_normal((n, c, h, h), dtype=numpy.float32)
        x, gy = channels_last(nchw), channels_last(nchw[::-1])
        major = [numpy.ascontiguousarray(a.swapaxes(0, 1)).swapaxes(0, 1)
                 for a in (x, gy)]
        gamma, beta = numpy.ones(c, numpy.float32), numpy.zeros(
            c, numpy.float32)
        lay = Layout(x.shape, (0, 2, 3))

        def step(fwd, bwd, x=x, gy=gy):
            node = N.BatchNormalization(lay, 2e-5, None, None, 0.9, True)
            fwd(node, (x, gamma, beta))
            grad = N.BatchNormalizationGrad(lay, 2e-5, node.mean,
                                            node.inv_std, node.centered)
            bwd(grad, (x, gamma, gy))
        step(bn, bn_grad)
        numpy_kernels = (numpy_bn.batch_normalization,
                         numpy_bn.batch_normalization_grad)
        t_one = _median_ms(lambda: step(bn, bn_grad), args.reps)
        t_body = _median_ms(lambda: step(body, body), args.reps)
        t_numpy = _median_ms(lambda: step(*numpy_kernels, *major),
                             args.reps)
        t_nchw = _median_ms(lambda: step(*numpy_kernels, nchw,
                                         numpy.ascontiguousarray(gy)),
                            args.reps)
        print('{:<28} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>15.2f}x'.format(
            ','.join(map(str, (n, c, h))), t_body, t_numpy, t_nchw, t_one,
            t_numpy / t_one))
    _inference_bn(onednn, numpy_bn, body, channels_last, rng, args.reps)


def _inference_bn(onednn, numpy_bn, body, channels_last, rng, reps):
    """Inference-mode batch normalization (an evaluation's), on the
    channels-last x the convolutions return: body, NumPy kernel, oneDNN."""
    print('{:<28} {:>8} {:>8} {:>8} {:>16}'.format(
        'inference batch norm n,c,h', 'body', 'NumPy', 'oneDNN',
        'NumPy / oneDNN'))
    for n, c, h in BNS:
        x = channels_last(rng.standard_normal((n, c, h, h),
                                              dtype=numpy.float32))
        stats = [numpy.ones(c, numpy.float32) for _ in range(4)]
        node = N.FixedBatchNormalization(Layout(x.shape, (0, 2, 3)), 2e-5)
        inputs = (x,) + tuple(stats)
        t = [_median_ms(lambda f=f: f(node, inputs), reps) for f in (
            body, numpy_bn.fixed_batch_normalization,
            onednn.normalization.fixed_batch_normalization)]
        print('{:<28} {:>8.2f} {:>8.2f} {:>8.2f} {:>15.2f}x'.format(
            ','.join(map(str, (n, c, h))), *t, t[1] / t[2]))



def _evaluation(onednn, pairs):
    """make train's evaluation forward (ResNet-50, small2 stem, 28 px,
    batch 200, test mode), the inference batch-norm kernel declining
    against registered, in interleaved pairs (onednn_ops._pairs)."""
    import minichain
    from minichain import kernels
    from models.resnet import ResNet50, loss_and_accuracy
    import onednn_ops
    model = ResNet50(10, stem='small2', in_channels=1)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((200, 1, 28, 28), dtype=numpy.float32)
    t = rng.integers(0, 10, 200).astype(numpy.int32)
    kernel = kernels.registered(N.FixedBatchNormalization, 'onednn')

    def forward(with_kernel):
        def run():
            kernels.register(N.FixedBatchNormalization, 'onednn',
                             kernel if with_kernel else
                             (lambda node, inputs: None))
            with minichain.using_config('train', False), \
                    minichain.no_backprop_mode():
                loss_and_accuracy(model, x, t)
        return run
    ratio = onednn_ops._pairs(forward(False), forward(True), pairs)
    print('evaluation forward, batch 200, without / with the inference '
          'batch-norm kernel: {:.2f}x ({:.2f}-{:.2f}), {} pairs, {} '
          'thread(s)'.format(*ratio, pairs, onednn._dnnl.threads()))


if __name__ == '__main__':
    main()
