"""MomentumSGD's update on oneDNN against its body, in interleaved pairs.

Two figures, each the median over pairs of body time / oneDNN time (above
1: oneDNN faster) with the pairs' quartiles:

- the whole update of ResNet-50's parameters (the main job's model,
  23.5 million float32), with weight decay as ``make train`` runs it,
  against the body with the rule's decay and against the old recipe
  (the body plus the ``WeightDecay`` hook, which allocates a new gradient
  per parameter), and without weight decay;
- one parameter of each size around the kernel's ``_MIN_SIZE``, which
  sets where the kernel stops paying for its two executes.

    OMP_NUM_THREADS=1 python bench/onednn_update.py [--pairs 15]
"""
import argparse
import copy
import os
import sys

import numpy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
import minichain  # noqa: E402
from minichain import optimizer_hooks, optimizers  # noqa: E402
from models.resnet import ResNet50  # noqa: E402

import onednn_ops  # noqa: E402  (beside this file)


def _pairs(a, b, n):
    """onednn_ops' pairs (median and quartiles of time(a) / time(b)),
    then the median times of a and b in ms."""
    times = {}
    ratio = onednn_ops._pairs(a, b, n, times)
    return ratio + tuple(1e3 * float(numpy.median(times[k])) for k in 'ab')


def _updater(model, wd, mode, hook=False):
    """A function that runs one update of ``model``'s parameters with
    ``config.use_onednn = mode`` (each its own optimizer and state)."""
    model = copy.deepcopy(model)
    rng = numpy.random.default_rng(0)
    params = [p for _, p in sorted(model.namedparams())]
    grads = [(rng.standard_normal(p.shape) * 1e-3).astype(numpy.float32)
             for p in params]
    opt = optimizers.MomentumSGD(lr=0.01, momentum=0.9,
                                 weight_decay_rate=0 if hook else wd)
    opt.setup(model)
    if hook:
        opt.add_hook(optimizer_hooks.WeightDecay(wd))

    def run():
        for p, g in zip(params, grads):
            p.grad = g   # the hook replaces it; this puts it back
        with minichain.using_config('use_onednn', mode):
            opt.update()
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--pairs', type=int, default=15)
    args = parser.parse_args()
    from minichain.kernels import onednn
    if not onednn.available():
        sys.exit('oneDNN does not load: ' + str(onednn._load_error))
    print('MomentumSGD update, body / oneDNN (median, quartiles of {} '
          'pairs), {} thread(s)'.format(args.pairs, onednn._dnnl.threads()))
    model = ResNet50(n_classes=10, stem='small2', in_channels=1)
    n = sum(p.size for _, p in model.namedparams())
    fast = _updater(model, 1e-4, 'auto')
    for label, slow in (
            ('body, decay in the rule', _updater(model, 1e-4, 'never')),
            ('body + WeightDecay hook', _updater(model, 1e-4, 'never',
                                                 hook=True))):
        print('ResNet-50, {:,} parameters, {}: {:.2f} ({:.2f}-{:.2f}); '
              '{:.1f} ms / {:.1f} ms'.format(n, label, *_pairs(
                  slow, fast, args.pairs)))
    print('ResNet-50, no weight decay: {:.2f} ({:.2f}-{:.2f}); {:.1f} ms / '
          '{:.1f} ms'.format(
        *_pairs(_updater(model, 0, 'never'), _updater(model, 0, 'auto'),
                args.pairs)))
    onednn.optimizers._MIN_SIZE = 0   # time the sizes it would decline
    for size in (4096, 65536, 262144, 1048576):
        link = minichain.Link()
        with link.init_scope():
            link.w = minichain.Parameter(numpy.zeros(size, numpy.float32))
        ratio = _pairs(_updater(link, 1e-4, 'never'),
                       _updater(link, 1e-4, 'auto'),
                       max(args.pairs, 2 ** 24 // size))
        print('one parameter of {:>7} elements: {:.2f} ({:.2f}-{:.2f}); '
              '{:.3f} ms / {:.3f} ms'.format(size, *ratio))


if __name__ == '__main__':
    main()
