#!/usr/bin/env python
"""Model and data parallelism together, in the shape of ChainerMN's
dual-parallel MNIST example: each pair of ranks holds the MLP cut in two
(ranks 0 and 1, 2 and 3...), and the ranks that hold the same half average
their gradients: mpiexec -n 4 python train_mnist_dual_parallel.py"""
import argparse

import minichain as chainer
import minichain.cuda
from minichain import links as L
from minichain import training
from minichain.training import extensions

from minichain import dist as chainermn
import minichain.dist.datasets

# The same two halves as the model-parallel example (ChainerMN's two
# examples each define them).
from train_mnist_model_parallel import Rank0Part, Rank1Part


def main():
    parser = argparse.ArgumentParser(description='dual-parallel MNIST')
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
    # half: which half of the MLP this rank holds; pair: which copy of it
    half, pair = comm.rank % 2, comm.rank // 2
    data_comm = comm.split(half, comm.rank)    # the copies of one half
    model_comm = comm.split(pair, comm.rank)   # the two halves of a copy

    if model_comm.size != 2:
        raise ValueError('this example runs on an even number of processes')

    if comm.rank == 0:
        print('Num unit: {}, minibatch: {}, epoch: {}'.format(
            args.unit, args.batchsize, args.epoch))

    if half == 0:
        model = L.Classifier(Rank0Part(model_comm, args.unit))
    elif half == 1:
        model = Rank1Part(model_comm, args.unit, 10)

    if device >= 0:
        chainer.cuda.get_device_from_id(device).use()
        model.to_gpu()

    optimizer = chainermn.create_multi_node_optimizer(
        chainer.optimizers.Adam(), data_comm)
    optimizer.setup(model)

    # The first pair reads the data (its second rank as empty examples);
    # each half's copies get equal shards of it.
    if pair == 0:
        train, test = chainer.datasets.get_mnist()
        if half == 1:
            train = chainermn.datasets.create_empty_dataset(train)
            test = chainermn.datasets.create_empty_dataset(test)
    else:
        train, test = None, None
    train = chainermn.scatter_dataset(train, data_comm, shuffle=True)
    test = chainermn.scatter_dataset(test, data_comm, shuffle=True)

    train_iter = chainer.iterators.SerialIterator(
        train, args.batchsize, shuffle=False)
    test_iter = chainer.iterators.SerialIterator(
        test, args.batchsize, repeat=False, shuffle=False)

    updater = training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)
    evaluator = extensions.Evaluator(test_iter, model, device=device)
    evaluator = chainermn.create_multi_node_evaluator(evaluator, data_comm)
    trainer.extend(evaluator)

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
