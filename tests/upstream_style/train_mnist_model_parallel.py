#!/usr/bin/env python
"""An MLP cut over two MPI ranks, in the shape of ChainerMN's model-parallel
MNIST example: mpiexec -n 2 python train_mnist_model_parallel.py"""
import argparse

import minichain as chainer
import minichain.cuda
from minichain import functions as F
from minichain import links as L
from minichain import training
from minichain.training import extensions

from minichain import dist as chainermn
import minichain.dist.datasets
import minichain.dist.functions


chainer.disable_experimental_feature_warning = True


class FirstLayer(chainer.Chain):
    def __init__(self, comm, n_out):
        # Chainer v1's keyword registration, as the example writes it
        super(FirstLayer, self).__init__(l1=L.Linear(784, n_out))

    def __call__(self, x):
        return F.relu(self.l1(x))


class Identity(chainer.Chain):
    def __init__(self, comm):
        super(Identity, self).__init__()

    def __call__(self, y):
        return y


class Rank0Part(chainermn.MultiNodeChainList):
    # the first layer, to rank 1; rank 1's output, as the model's result
    def __init__(self, comm, n_out):
        super(Rank0Part, self).__init__(comm=comm)
        self.add_link(FirstLayer(comm, n_out), rank_in=None, rank_out=1)
        self.add_link(Identity(comm), rank_in=1, rank_out=None)


class LastLayers(chainer.Chain):
    def __init__(self, n_units, n_out):
        super(LastLayers, self).__init__(
            l2=L.Linear(None, n_units),
            l3=L.Linear(None, n_out))

    def __call__(self, h):
        return self.l3(F.relu(self.l2(h)))


class Rank1Part(chainermn.MultiNodeChainList):
    # from rank 0, back to rank 0
    def __init__(self, comm, n_units, n_out):
        super(Rank1Part, self).__init__(comm=comm)
        self.add_link(LastLayers(n_units, n_out), rank_in=0, rank_out=0)


def main():
    parser = argparse.ArgumentParser(description='model-parallel MNIST')
    parser.add_argument('--batchsize', '-b', type=int, default=100)
    parser.add_argument('--epoch', '-e', type=int, default=20)
    parser.add_argument('--gpu', '-g', action='store_true')
    parser.add_argument('--out', '-o', default='result')
    parser.add_argument('--unit', '-u', type=int, default=1000)
    args = parser.parse_args()

    if args.gpu:
        comm = chainermn.create_communicator('pure_nccl')
        device = comm.intra_rank
    else:
        comm = chainermn.create_communicator('naive')
        device = -1

    if comm.size != 2:
        raise ValueError('this example runs on exactly 2 processes')

    if comm.rank == 0:
        print('Num unit: {}, minibatch: {}, epoch: {}'.format(
            args.unit, args.batchsize, args.epoch))

    if comm.rank == 0:
        model = L.Classifier(Rank0Part(comm, args.unit))
    elif comm.rank == 1:
        model = Rank1Part(comm, args.unit, 10)

    if device >= 0:
        chainer.cuda.get_device_from_id(device).use()
        model.to_gpu()

    optimizer = chainer.optimizers.Adam()
    optimizer.setup(model)

    # Only rank 0 iterates over the data; rank 1 gets as many empty
    # examples, so that it takes as many steps.
    train, test = chainer.datasets.get_mnist()
    if comm.rank == 1:
        train = chainermn.datasets.create_empty_dataset(train)
        test = chainermn.datasets.create_empty_dataset(test)

    train_iter = chainer.iterators.SerialIterator(
        train, args.batchsize, shuffle=False)
    test_iter = chainer.iterators.SerialIterator(
        test, args.batchsize, repeat=False, shuffle=False)

    updater = training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)
    trainer.extend(extensions.Evaluator(test_iter, model, device=device))

    if comm.rank == 0:
        trainer.extend(extensions.DumpGraph('main/loss'))
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.PrintReport(
            ['epoch', 'main/loss', 'validation/main/loss',
             'main/accuracy', 'validation/main/accuracy', 'elapsed_time']))
        trainer.extend(extensions.ProgressBar())

    trainer.run()


if __name__ == '__main__':
    main()
