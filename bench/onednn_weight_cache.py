"""The convolution weights' reordered copy kept between calls
(``minichain/kernels/onednn/_plan.py``, ``CACHE_WEIGHTS``): a ResNet-50
training step, and an evaluation's forward pass, with the cache on and
off in alternation in one process (the parameters move at every step's
update, as in training; not between evaluation batches). The figure is
the median over pairs of time off / time on (above 1: the cache helps),
with the pairs' range.

    OMP_WAIT_POLICY=passive PYTHONPATH=. python bench/onednn_weight_cache.py
        [--batch 32] [--size 28] [--stem small2] [--eval-batch 200]
        [--pairs 7]
"""
import argparse
import statistics
import time

import numpy


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--size', type=int, default=28)
    p.add_argument('--stem', default='small2')
    p.add_argument('--eval-batch', type=int, default=200)
    p.add_argument('--pairs', type=int, default=7)
    args = p.parse_args()
    import minichain
    from minichain import host, optimizers
    from minichain.kernels.onednn import _plan
    from models.resnet import ResNet50, loss_and_accuracy
    host.tune_malloc()
    model = ResNet50(10, stem=args.stem, in_channels=1)
    opt = optimizers.MomentumSGD(lr=0.01, momentum=0.9).setup(model)
    rng = numpy.random.default_rng(0)

    def images(n):
        return rng.standard_normal((n, 1, args.size, args.size),
                                   dtype=numpy.float32)
    x, xe = images(args.batch), images(args.eval_batch)
    t = rng.integers(0, 10, args.batch).astype(numpy.int32)

    def train():
        opt.update(loss_and_accuracy, model, x, t)

    def evaluate():
        with minichain.no_backprop_mode(), \
                minichain.using_config('train', False):
            model(xe)

    def timed(fn, cache):
        _plan.CACHE_WEIGHTS = cache
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    print('{} x {} px, {} stem; evaluation batch {}; time without the '
          'cache / with it, median of {} pairs (range)'.format(
              args.batch, args.size, args.stem, args.eval_batch, args.pairs))
    for name, fn in (('training step', train), ('evaluation forward',
                                                 evaluate)):
        timed(fn, True), timed(fn, False)   # primitives built
        ratios = []
        for i in range(args.pairs):
            order = (True, False) if i % 2 else (False, True)
            t_ = {c: timed(fn, c) for c in order}
            ratios.append(t_[False] / t_[True])
        print('{:<20} {:5.3f}x  ({:.3f}-{:.3f})'.format(
            name, statistics.median(ratios), min(ratios), max(ratios)),
            flush=True)


if __name__ == '__main__':
    main()
