"""What each NumPy kernel gives a ResNet-50 training step: the step with
every kernel, against the step with one kernel taken out (its op runs its
plain body), and with none.

One process, the main job's shape by default (batch 32, 28 px, the small2
stem). Every round runs two steps of each variant in a rotating order (the first
untimed), so that the machine's drift touches them alike; a variant's figure is the
median over rounds of its step time divided by the all-kernels step of the
same round. Taking a kernel out also changes what its neighbours see (no
convolution kernel: C-contiguous activations instead of channel-major
ones), which is what retiring it would do.

    PYTHONPATH=. python bench/kernel_value.py [--batch 32] [--size 28]
        [--stem small2] [--rounds 5] [--warmup 1] [--threads 2]
"""
import argparse
import os
import statistics
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORES = len(os.sched_getaffinity(0))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--size', type=int, default=28)
    p.add_argument('--stem', default='small2')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--threads', type=int, default=CORES)
    args = p.parse_args()
    os.environ.setdefault('OPENBLAS_NUM_THREADS', str(args.threads))
    sys.path.insert(0, ROOT)
    import minichain
    from minichain import host, kernel_seam as kernels, optimizers
    from models.resnet import ResNet50, loss_and_accuracy
    host.tune_malloc()
    host.set_blas_threads(args.threads)

    model = ResNet50(1000, stem=args.stem)
    opt = optimizers.MomentumSGD(lr=0.01, momentum=0.9).setup(model)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((args.batch, 3, args.size, args.size),
                            dtype=numpy.float32)
    t = rng.integers(0, 1000, args.batch).astype(numpy.int32)

    def step():
        start = time.perf_counter()
        opt.update(loss_and_accuracy, model, x, t)
        return time.perf_counter() - start

    # The first step loads the kernel package (so that the registry is
    # full) and shows which node types the step meets.
    met = {optimizers.momentum_sgd.MomentumSGDRule}
    real_forward = kernels.forward

    def spy(node, inputs):
        met.add(type(node))
        return real_forward(node, inputs)
    kernels.forward = spy
    try:
        step()
    finally:
        kernels.forward = real_forward
    numpy_kernels = sorted((k for k in kernels.registry
                            if k[1] == 'numpy' and k[0] in met),
                           key=lambda k: k[0].__name__)
    variants = ['all'] + [k[0].__name__ for k in numpy_kernels] + ['none']

    def run(variant):
        if variant == 'none':
            with minichain.using_config('use_kernels', False):
                return step()
        if variant == 'all':
            return step()
        key = next(k for k in numpy_kernels if k[0].__name__ == variant)
        kernel = kernels.registry.pop(key)
        try:
            return step()
        finally:
            kernels.registry[key] = kernel

    for _ in range(args.warmup):
        for v in variants:
            run(v)
    times = {v: [] for v in variants}
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            # One untimed step of the variant first: the timed one then
            # finds the allocator and caches as its own steps leave them,
            # not as the variant before it did (after 'bodies only', the
            # next step read 5-8% slower whatever it was).
            run(v)
            times[v].append(run(v))
    print('{} x {} px, {} stem, {} thread(s), {} rounds; step time against '
          'all kernels in the same round (median, range)'.format(
              args.batch, args.size, args.stem, args.threads, args.rounds))
    for v in variants:
        ratios = [a / b for a, b in zip(times[v], times['all'])]
        print('{:<34} {:7.3f} s  {:5.2f}x  ({:.2f}-{:.2f})'.format(
            {'all': 'all kernels', 'none': 'bodies only'}.get(
                v, 'without ' + v),
            statistics.median(times[v]), statistics.median(ratios),
            min(ratios), max(ratios)))


if __name__ == '__main__':
    main()
