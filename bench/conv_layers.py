"""ResNet-50's convolutions one at a time on the CPU, next to PyTorch's.

The script records every convolution of one training step of the bundled
ResNet-50 at a shape (input, weight, stride, padding, and how many times
the step runs it). It then times each one alone: minichain's forward,
input gradient and weight gradient (the ``Convolution2D``,
``Deconvolution2D`` and ``Convolution2DGradW`` nodes, as the step runs
them: through the kernel seam, so a oneDNN kernel where one takes the
shape, else the body; ``MINICHAIN_ONEDNN=never`` times the bodies), and
PyTorch's
forward and ``convolution_backward`` (both gradients) on the same arrays.
All of minichain's timings come first, PyTorch's after them, because
PyTorch's OpenMP threads spin after each call and would slow what runs
next to them. Each figure is the median of ``--rounds`` calls. The totals
are weighted by how often the step runs each layer. bench/README.md has
what this showed at the main job's shape.

    PYTHONPATH=. python bench/conv_layers.py [--batch 32] [--size 28]
        [--stem small2] [--threads 2] [--rounds 7] [--no-torch]
"""
import argparse
import collections
import os
import statistics
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record(batch, size, stem):
    """``{(x shape, W shape, stride, pad): count}`` of one forward pass."""
    from minichain import kernel_seam as kernels
    from minichain.functions import convolution
    from models.resnet import ResNet50, loss_and_accuracy
    seen = collections.Counter()
    real = kernels.forward

    def spy(node, inputs):
        if type(node) is convolution.Convolution2D:
            x, W = inputs[:2]
            seen[(x.shape, W.shape, node.stride, node.pad)] += 1
        return real(node, inputs)
    kernels.forward = spy  # the seam that FunctionNode.apply calls
    try:
        rng = numpy.random.default_rng(0)
        x = rng.standard_normal((batch, 3, size, size), dtype=numpy.float32)
        t = rng.integers(0, 1000, batch).astype(numpy.int32)
        loss_and_accuracy(ResNet50(1000, stem=stem), x, t)
    finally:
        kernels.forward = real
    return seen


def median_ms(fn, rounds):
    fn()  # warm-up: workspaces, page faults
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def layer_arrays(key, seed):
    from minichain.functions import convolution_2d
    xs, ws, stride, pad = key
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(xs, dtype=numpy.float32)
    W = (rng.standard_normal(ws) * 0.05).astype(numpy.float32)
    y = convolution_2d(x, W, stride=stride, pad=pad).array
    return x, W, rng.standard_normal(y.shape, dtype=numpy.float32)


def time_minichain(key, rounds):
    """Forward, input gradient, weight gradient (ms), each as a step runs
    it: the kernel that takes the arrays, else the body."""
    from minichain import kernel_seam as kernels
    from minichain.functions.convolution import (
        Convolution2D, Convolution2DGradW, Deconvolution2D)
    xs, ws, stride, pad = key
    x, W, gy = layer_arrays(key, 1)
    fwd = Convolution2D(stride, pad, False, (1, 1), 1)
    gx = Deconvolution2D(stride, pad, xs[2:], False, (1, 1), 1)
    gw = Convolution2DGradW(ws, stride, pad, False, (1, 1), 1)
    return (median_ms(lambda: kernels.forward(fwd, (x, W)), rounds),
            median_ms(lambda: kernels.forward(gx, (gy, W)), rounds),
            median_ms(lambda: kernels.forward(gw, (x, gy)), rounds))


def time_torch(key, rounds, threads):
    """Forward, both gradients (ms)."""
    import torch
    torch.set_num_threads(threads)
    _, _, stride, pad = key
    x, W, gy = (torch.from_numpy(a) for a in layer_arrays(key, 1))

    def forward():
        with torch.no_grad():
            torch.nn.functional.conv2d(x, W, stride=stride, padding=pad)

    def backward():
        torch.ops.aten.convolution_backward(
            gy, x, W, None, list(stride), list(pad), [1, 1], False, [0, 0],
            1, [True, True, False])
    return median_ms(forward, rounds), median_ms(backward, rounds)


def kind(key):
    ws, stride = key[1], key[2]
    return '{}x{} s{}'.format(ws[2], ws[3], stride[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--batch', type=int, default=32)
    parser.add_argument('--size', type=int, default=28)
    parser.add_argument('--stem', default='small2')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument('--no-torch', action='store_true')
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    from minichain import host
    host.tune_malloc()
    host.set_blas_threads(args.threads)
    layers = record(args.batch, args.size, args.stem)
    ours = {key: time_minichain(key, args.rounds) for key in layers}
    theirs = ({} if args.no_torch else
              {key: time_torch(key, args.rounds, args.threads)
               for key in layers})
    print('ResNet-50 convolutions, batch {}, {} px, {} stem, {} thread(s);'
          ' ms per call, median of {}'.format(args.batch, args.size,
                                             args.stem, args.threads,
                                             args.rounds))
    print('%-5s %-18s %-18s %-5s %22s %17s' % (
        'count', 'x', 'W', 'kind', 'minichain fwd gx gW', 'torch fwd bwd'))
    totals = collections.defaultdict(lambda: [0.0, 0.0])
    for key, count in sorted(layers.items(), key=lambda kv: kind(kv[0])):
        mine = ours[key]
        line = '%-5d %-18s %-18s %-5s %6.2f %6.2f %6.2f' % (
            count, key[0], key[1], kind(key), *mine)
        totals[kind(key)][0] += count * sum(mine)
        if key in theirs:
            line += '    %6.2f %6.2f' % theirs[key]
            totals[kind(key)][1] += count * sum(theirs[key])
        print(line)
    print('per step, by kind (ms): ' + '; '.join(
        '{} {:.1f}'.format(k, v[0]) + (' vs {:.1f}'.format(v[1])
                                        if theirs else '')
        for k, v in sorted(totals.items())))
    return 0


if __name__ == '__main__':
    sys.exit(main())
