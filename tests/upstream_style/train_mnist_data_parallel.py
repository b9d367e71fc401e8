#!/usr/bin/env python
"""MNIST MLP over MPI ranks, in the shape of ChainerMN's MNIST example:
mpiexec -n 2 python train_mnist_data_parallel.py"""
from __future__ import print_function

import argparse

import minichain as chainer
from minichain import functions as F, links as L, training
from minichain.training import extensions
from minichain import chainerx

from minichain import dist as chainermn


class MLP(chainer.Chain):

    def __init__(self, n_units, n_out):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(None, n_units)
            self.l3 = L.Linear(None, n_out)

    def __call__(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


def main():
    parser = argparse.ArgumentParser(description='data-parallel MNIST')
    parser.add_argument('--batchsize', '-b', type=int, default=100)
    parser.add_argument('--communicator', type=str, default='pure_nccl')
    parser.add_argument('--epoch', '-e', type=int, default=20)
    parser.add_argument('--gpu', '-g', action='store_true')
    parser.add_argument('--chainerx', '-x', action='store_true',
                        default=False)
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--resume', '-r', default='')
    parser.add_argument('--unit', '-u', type=int, default=1000)
    args = parser.parse_args()

    if args.gpu:
        comm = chainermn.create_communicator(args.communicator)
        if args.chainerx:
            device = chainer.get_device('cuda:{}'.format(comm.intra_rank))
        else:
            device = chainer.get_device(comm.intra_rank)
    else:
        if args.communicator != 'naive':
            print('Warning: the CPU runs with the naive communicator')
        comm = chainermn.create_communicator('naive')
        device = chainer.get_device('native' if args.chainerx else -1)

    if comm.rank == 0:
        print('Num process (COMM_WORLD): {}'.format(comm.size))
        print('Using {} communicator'.format(args.communicator))
        print('Num unit: {}, minibatch: {}, epoch: {}'.format(
            args.unit, args.batchsize, args.epoch))

    model = L.Classifier(MLP(args.unit, 10))
    model.to_device(device)

    optimizer = chainermn.create_multi_node_optimizer(
        chainer.optimizers.Adam(), comm)
    optimizer.setup(model)

    # Rank 0 reads MNIST; every rank receives an equal shard.
    if comm.rank == 0:
        train, test = chainer.datasets.get_mnist()
    else:
        train, test = None, None
    train = chainermn.scatter_dataset(train, comm, shuffle=True)
    test = chainermn.scatter_dataset(test, comm, shuffle=True)

    train_iter = chainer.iterators.SerialIterator(train, args.batchsize)
    test_iter = chainer.iterators.SerialIterator(
        test, args.batchsize, repeat=False, shuffle=False)

    updater = training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    evaluator = extensions.Evaluator(test_iter, model, device=device)
    evaluator = chainermn.create_multi_node_evaluator(evaluator, comm)
    trainer.extend(evaluator)

    # Output from one rank only; it also writes the snapshots.
    if comm.rank == 0:
        if device.xp is not chainerx:
            trainer.extend(extensions.DumpGraph('main/loss'))
        trainer.extend(extensions.snapshot(), trigger=(1, 'epoch'))
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.PrintReport(
            ['epoch', 'main/loss', 'validation/main/loss',
             'main/accuracy', 'validation/main/accuracy', 'elapsed_time']))
        trainer.extend(extensions.ProgressBar())

    # Every rank resumes from rank 0's snapshot.
    if args.resume:
        chainer.serializers.load_npz(args.resume, trainer)

    trainer.run()


if __name__ == '__main__':
    main()
