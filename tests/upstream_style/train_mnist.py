#!/usr/bin/env python
"""MNIST MLP on one process, in the shape of Chainer's MNIST example."""
import argparse

import minichain as chainer
from minichain import functions as F, links as L, training
from minichain.training import extensions
from minichain import chainerx

import matplotlib
matplotlib.use('Agg')


class MLP(chainer.Chain):
    """Two hidden layers; every input size is inferred at the first call."""

    def __init__(self, n_units, n_out):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_units)
            self.l3 = L.Linear(None, n_out)

    def forward(self, x):
        h = F.relu(self.l1(x))
        h = F.relu(self.l2(h))
        return self.l3(h)


def parse_args():
    parser = argparse.ArgumentParser(description='MLP on MNIST')
    parser.add_argument('--batchsize', '-b', type=int, default=100)
    parser.add_argument('--epoch', '-e', type=int, default=20)
    parser.add_argument('--frequency', '-f', type=int, default=-1,
                        help='snapshot every this many epochs '
                        '(-1: at the end only)')
    parser.add_argument('--device', '-d', type=str, default='-1',
                        help='-1 for the CPU, N >= 0 for GPU N')
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--resume', '-r', type=str,
                        help='snapshot file to resume from')
    parser.add_argument('--autoload', action='store_true',
                        help='resume from the newest snapshot in --out')
    parser.add_argument('--unit', '-u', type=int, default=1000)
    return parser.parse_args()


def main():
    args = parse_args()
    device = chainer.get_device(args.device)
    print('Device: {}'.format(device))
    print('# unit: {}, # minibatch: {}, # epoch: {}'.format(
        args.unit, args.batchsize, args.epoch))

    model = L.Classifier(MLP(args.unit, 10))
    model.to_device(device)
    device.use()

    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)

    train, test = chainer.datasets.get_mnist()
    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(
        test, args.batchsize, repeat=False, shuffle=False)

    updater = training.updaters.StandardUpdater(
        train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    # Validation, logging and plots also run once before training starts.
    trainer.extend(extensions.Evaluator(test_iter, model, device=device),
                   call_before_training=True)
    if device.xp is not chainerx:
        trainer.extend(extensions.DumpGraph('main/loss'))

    every = args.epoch if args.frequency == -1 else max(1, args.frequency)
    trainer.extend(extensions.snapshot(n_retains=1, autoload=args.autoload),
                   trigger=(every, 'epoch'))

    trainer.extend(extensions.LogReport(), call_before_training=True)
    trainer.extend(extensions.PlotReport(
        ['main/loss', 'validation/main/loss'], 'epoch',
        file_name='loss.png'), call_before_training=True)
    trainer.extend(extensions.PlotReport(
        ['main/accuracy', 'validation/main/accuracy'], 'epoch',
        file_name='accuracy.png'), call_before_training=True)
    trainer.extend(extensions.PrintReport(
        ['epoch', 'main/loss', 'validation/main/loss', 'main/accuracy',
         'validation/main/accuracy', 'elapsed_time']),
        call_before_training=True)
    trainer.extend(extensions.ProgressBar())

    if args.resume is not None:
        chainer.serializers.load_npz(args.resume, trainer)

    trainer.run()


if __name__ == '__main__':
    main()
