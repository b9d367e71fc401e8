#!/usr/bin/env python
"""Data-parallel MLP on Fashion-MNIST (the shape of ChainerMN's MNIST example).

    python models/train_mnist.py                         # one process
    mpiexec -n 4 python models/train_mnist.py --epoch 5  # four ranks, CPU
    mpiexec -n 2 python models/train_mnist.py --device gpu  # a GPU per rank

An ordinary trainer script plus ChainerMN's four calls: create_communicator,
create_multi_node_optimizer, scatter_dataset (rank 0 alone reads the data)
and create_multi_node_evaluator, and multi_node_snapshot for snapshots that
every rank resumes from. Rank 0 prints the report and the progress bar and
writes out/log (a JSON list, one entry per epoch), the graph of the loss
(out/cg.dot) and the snapshots (every epoch, and with --snapshot-every
also in between, so that a job killed by its batch system loses at most
that much). The IDX files are read from --data-dir,
$MINICHAIN_DATASET_ROOT or /usr/share/datasets/fashion-mnist (see
minichain.datasets.get_fashion_mnist). With --device gpu and no
--communicator, pure_nccl is used when NCCL works, else flat.
"""
import argparse
import sys

import minichain
from minichain import dist, initializers
from minichain import functions as F
from minichain import links as L
from minichain import training
from minichain.training import extensions


class MLP(minichain.Chain):
    """Three fully connected layers with ReLU between them.

    Input ``(N, 784)`` (any trailing shape: the first layer infers its input
    size), output ``(N, n_out)`` class scores.
    """

    def __init__(self, n_units, n_out):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(None, n_units)
            self.l2 = L.Linear(n_units, n_units)
            self.l3 = L.Linear(n_units, n_out)

    def forward(self, x):
        """Scores of ``x``."""
        h = F.relu(self.l1(x))
        h = F.relu(self.l2(h))
        return self.l3(h)


def parse_args(argv=None):
    """The command line (the same on every rank)."""
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    a = p.add_argument
    a('--batchsize', '-b', type=int, default=100,
      help='images per rank and iteration')
    a('--epoch', '-e', type=float, default=20,
      help='epochs to train (a fraction is allowed)')
    a('--unit', '-u', type=int, default=1000, help='units per hidden layer')
    a('--communicator', choices=('naive', 'flat', 'pure_nccl',
                                 'hierarchical'),
      help="default: 'pure_nccl' on GPUs (when NCCL is usable, else "
      "'flat'), 'flat' on the CPU")
    a('--device', '-d', default='cpu',
      help="'cpu', 'gpu' (GPU <local rank> on each rank) or a device spec "
      "('@numpy', '@cupy:N', N)")
    a('--out', '-o', default='result', help='output folder (rank 0)')
    a('--data-dir', help='folder holding the Fashion-MNIST IDX files')
    a('--seed', type=int, default=0,
      help='seed of the initial weights and of the shuffling')
    a('--snapshot-interval', type=int, default=1,
      help='write a snapshot every N epochs (0: never)')
    a('--snapshot-every', type=extensions.parse_interval, metavar='N|Nm|Nh',
      help='also snapshot every N iterations (or 30m, 2h...); snapshots are '
      'then named by iteration, and each one between epochs replaces the '
      'previous one')
    a('--resume', '-r', help='a snapshot written by this script, with the '
      'same number of processes')
    args = p.parse_args(argv)
    if args.batchsize < 1 or args.unit < 1 or not args.epoch > 0:
        p.error('--batchsize, --unit and --epoch must be positive')
    if args.snapshot_interval < 0:
        p.error('--snapshot-interval must not be negative')
    return args


def uses_gpu(spec):
    """Whether ``--device spec`` names a GPU."""
    text = spec.strip().lower()
    return text == 'gpu' or text.startswith(('@cupy', 'cuda')) or \
        text.isdigit()


def device_spec(spec, comm):
    """The get_device spec of this rank: 'gpu' picks this rank's GPU among
    the visible ones (minichain.device.get_rank_device); a plain number is
    an int spec."""
    if spec.strip().lower() == 'gpu':
        return minichain.device.get_rank_device(comm.intra_rank,
                                                comm.intra_size)
    if spec.strip().lstrip('-').isdigit():
        return int(spec)
    return spec


def load_on_root(comm, data_dir):
    """``(train, test)`` on rank 0, ``(None, None)`` elsewhere. A missing or
    corrupt file ends every rank with rank 0's message (SystemExit(1))."""
    data, error = (None, None), None
    if comm.rank == 0:
        try:
            data = minichain.datasets.get_fashion_mnist(data_dir=data_dir)
        except (OSError, ValueError) as e:
            error = str(e)
    error = comm.bcast_obj(error, 0)
    if error is not None:
        if comm.rank == 0:
            print('train_mnist.py: error: ' + error, file=sys.stderr)
        raise SystemExit(1)
    return data


def main(argv=None):
    """Train; returns the trainer (rank 0's holds the log)."""
    args = parse_args(argv)
    comm = dist.create_communicator(
        args.communicator or ('auto' if uses_gpu(args.device) else 'flat'))
    device = minichain.get_device(device_spec(args.device, comm))
    device.use()

    if comm.rank == 0:
        print('{} process(es), {}, device {}, {} units, batch {} per rank, '
              '{} epoch(s)'.format(comm.size, type(comm).__name__,
                                   device.name, args.unit, args.batchsize,
                                   args.epoch), flush=True)

    initializers.set_random_seed(args.seed)
    model = L.Classifier(MLP(args.unit, 10))
    model.to_device(device)
    optimizer = dist.create_multi_node_optimizer(
        minichain.optimizers.Adam(), comm)
    optimizer.setup(model)

    # Rank 0 reads the whole set and sends each rank its shard. The test set
    # is split without repeats, so the multi-node evaluator's means are
    # exactly those of one process evaluating all of it.
    train, test = load_on_root(comm, args.data_dir)
    train = dist.scatter_dataset(train, comm, shuffle=True, seed=args.seed)
    test = dist.scatter_dataset(test, comm, force_equal_length=False)

    train_iter = minichain.iterators.SerialIterator(train, args.batchsize,
                                                    seed=args.seed)
    test_iter = minichain.iterators.SerialIterator(
        test, args.batchsize, repeat=False, shuffle=False)

    updater = training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    evaluator = extensions.Evaluator(test_iter, model, device=device)
    trainer.extend(dist.create_multi_node_evaluator(evaluator, comm))

    # On every rank: only rank 0 writes, but resuming is collective.
    name = ('snapshot_iter_{.updater.iteration}' if args.snapshot_every
            else 'snapshot_epoch_{.updater.epoch}')
    snap = dist.multi_node_snapshot(comm, extensions.snapshot(filename=name))
    extensions.extend_snapshots(trainer, snap, name, args.snapshot_interval
                                and (args.snapshot_interval, 'epoch'),
                                args.snapshot_every, comm)

    # Reports are for one rank only (otherwise every line comes N times).
    if comm.rank == 0:
        trainer.extend(extensions.DumpGraph('main/loss'))  # out/cg.dot
        trainer.extend(extensions.LogReport())
        trainer.extend(extensions.PrintReport(
            ['epoch', 'main/loss', 'validation/main/loss', 'main/accuracy',
             'validation/main/accuracy', 'elapsed_time']))
        trainer.extend(extensions.ProgressBar(update_interval=10))

    if args.resume:
        try:
            snap.load(args.resume, trainer)
        except ValueError as e:  # raised on every rank alike
            if comm.rank == 0:
                print('train_mnist.py: error: {}'.format(e), file=sys.stderr)
            raise SystemExit(1)

    trainer.run()
    return trainer


if __name__ == '__main__':
    minichain.host.tune_malloc()  # reuse freed buffers (minichain.host)
    main()
