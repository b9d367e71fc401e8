"""What the graph holds at the end of a ResNet forward, in MiB of arrays.

Two figures for the same forward (softmax cross-entropy included):
``inputs``, the arrays that a graph holding every function's inputs keeps
alive (minichain before retain_inputs was made real, 0f22c52), and
``retained``, the arrays that the functions declared with ``retain_inputs``
/ ``retain_outputs`` (what the graph keeps now). Parameters and the batch
are left out: they live anyway. Arrays an op stores on ``self`` are not
counted (by the house rules there are none but small ones). The figures are
exact byte counts, not timings: they do not depend on the machine.

    python bench/graph_bytes.py [--config 32x28:small2 ...] [--arch resnet50]

Peak resident memory of a whole training step, which adds the parameters,
gradients, momentum and the backward's buffers, is measured by
``resnet50_step.py`` (``--against`` a checkout from before the change).
"""
import argparse
import os
import sys

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from minichain import FunctionNode  # noqa: E402
from models.resnet import ResNet, loss_and_accuracy  # noqa: E402
# The same BATCHxSIZE:STEM option as the step benchmark, checked alike.
from resnet50_step import parse_config  # noqa: E402  (beside this file)

CONFIGS = ((32, 28, 'small2'), (8, 224, 'imagenet'))


def graph_mib(arch, batch, size, stem):
    """(functions, MiB of all inputs, MiB retained) for one forward."""
    model = ResNet(arch, 1000, stem=stem)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size), dtype=numpy.float32)
    t = rng.integers(0, 1000, batch).astype(numpy.int32)
    model(x[:1])  # creates the parameters
    applied, inputs = [], []
    apply = FunctionNode.apply

    def spy(func, args):
        outputs = apply(func, args)
        applied.append(func)
        # Held here, as the old graph held them, so that every id is unique.
        inputs.extend(getattr(a, 'array', a) for a in args)
        return outputs
    FunctionNode.apply = spy
    try:
        loss = loss_and_accuracy(model, x, t)
    finally:
        FunctionNode.apply = apply
    retained = [a for f in applied
                for a in (f._retained_input_data or ())
                + (f._retained_output_data or ())]
    skip = {id(p.array) for p in model.params()} | {id(x), id(t)}

    def mib(arrays):
        unique = {id(a): a for a in arrays if id(a) not in skip}
        return sum(a.nbytes for a in unique.values()) / 2.0 ** 20
    del loss
    return len(applied), mib(inputs), mib(retained)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--config', type=parse_config, action='append',
                   help='BATCHxSIZE:STEM (repeatable; default 32x28:small2 '
                        'and 8x224:imagenet)')
    p.add_argument('--arch', default='resnet50')
    args = p.parse_args()
    print('{:<8} {:>5} {:>4} {:<8} {:>9} {:>12} {:>12} {:>6}'.format(
        'arch', 'batch', 'px', 'stem', 'functions', 'inputs MiB',
        'retained MiB', 'ratio'))
    for batch, size, stem in args.config or CONFIGS:
        n, every, kept = graph_mib(args.arch, batch, size, stem)
        print('{:<8} {:>5} {:>4} {:<8} {:>9} {:>12.1f} {:>12.1f} {:>6.2f}'
              .format(args.arch, batch, size, stem, n, every, kept,
                      kept / every))


if __name__ == '__main__':
    main()
