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
--communicator, pure_nccl is used when NCCL works, else flat. Bad options,
an unusable --out or --device, missing data or a batch larger than a rank's
share of it end every rank with one line, through the same checks as
train_resnet50.py (models/train_checks.py).
"""
import os
import sys

if __package__ in (None, ''):  # run as a file: the checks are in models/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))))

import minichain  # noqa: E402
from minichain import dist, initializers  # noqa: E402
from minichain import functions as F  # noqa: E402
from minichain import links as L  # noqa: E402
from minichain import training  # noqa: E402
from minichain.training import extensions  # noqa: E402
from models import train_checks, train_data  # noqa: E402
from models.train_checks import UserError, agree, on_root  # noqa: E402

PROG = 'train_mnist.py'


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
    """The command line (the same on every rank), checked as
    train_resnet50.py's (UserError: one line)."""
    p = train_checks.Parser(prog=PROG, description=__doc__.split('\n')[0])
    a = p.add_argument
    a('--batchsize', '-b', type=int, default=100,
      help='images per rank and iteration')
    a('--epoch', '-e', type=float, default=20,
      help='epochs to train (a fraction is allowed)')
    a('--unit', '-u', type=int, default=1000, help='units per hidden layer')
    a('--dtype', choices=('float32', 'mixed16'), default='float32',
      help="'mixed16': float32 parameters, 16-bit activations (bfloat16 on "
      "the CPU, float16 on a GPU) and dynamic loss scaling, as Chainer's")
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
    train_checks.check_args(args)
    if args.snapshot_interval < 0:
        p.error('--snapshot-interval must be at least 0, got {}'.format(
            args.snapshot_interval))
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


def get_device(spec, comm):
    """This rank's device, made current; UserError naming ``--device``."""
    try:
        device = minichain.get_device(device_spec(spec, comm))
        device.use()
    except (ValueError, TypeError, RuntimeError, ImportError) as e:
        raise UserError('--device {}: {}'.format(spec, e), status=2)
    return device


def load(data_dir):
    """``(train, test)``; UserError naming a missing or corrupt file."""
    try:
        return minichain.datasets.get_fashion_mnist(data_dir=data_dir)
    except (OSError, ValueError) as e:
        raise UserError(e)


def main(argv=None):
    """Train; returns the trainer (rank 0's holds the log). Bad input ends
    every rank with SystemExit(status) after rank 0 prints one line."""
    rank = train_checks.launcher_rank()
    try:
        args = parse_args(argv)
        try:
            comm = dist.create_communicator(args.communicator or (
                'auto' if uses_gpu(args.device) else 'flat'))
        except (ImportError, ValueError, RuntimeError) as e:
            raise UserError(e)
        rank = comm.rank
        return train(args, comm)
    except UserError as e:  # raised on every rank alike (see agree)
        if rank == 0:
            sys.stderr.write('{}: error: {}\n'.format(PROG, e))
            sys.stderr.flush()
        raise SystemExit(e.status)


def train(args, comm):
    """Train on every rank; returns the trainer."""
    on_root(comm, train_checks.check_out, args.out)
    device = agree(comm, get_device, args.device, comm)

    if comm.rank == 0:
        print('{} process(es), {}, device {}, {} units, batch {} per rank, '
              '{} epoch(s), {}'.format(comm.size, type(comm).__name__,
                                       device.name, args.unit,
                                       args.batchsize, args.epoch,
                                       args.dtype), flush=True)

    initializers.set_random_seed(args.seed)
    model = L.Classifier(MLP(args.unit, 10))
    model.to_device(device)
    optimizer = dist.create_multi_node_optimizer(
        minichain.optimizers.Adam(), comm)
    optimizer.setup(model)
    if args.dtype == 'mixed16':
        optimizer.loss_scaling()   # dynamic: skips an overflow, halves

    # Rank 0 reads the whole set and sends each rank its shard. The test set
    # is split without repeats, so the multi-node evaluator's means are
    # exactly those of one process evaluating all of it.
    train, test = on_root(comm, load, args.data_dir) or (None, None)
    train = dist.scatter_dataset(train, comm, shuffle=True, seed=args.seed)
    test = dist.scatter_dataset(test, comm, force_equal_length=False)
    # A batch larger than the shard would make each iteration several
    # epochs (-b 100000 --epoch 0.05 trained 3.3 epochs).
    agree(comm, train_data.check_shard, args, len(train), comm.size)

    train_iter = minichain.iterators.SerialIterator(train, args.batchsize,
                                                    seed=args.seed)
    test_iter = minichain.iterators.SerialIterator(
        test, args.batchsize, repeat=False, shuffle=False)

    updater = training.StandardUpdater(train_iter, optimizer, device=device)
    trainer = training.Trainer(updater, (args.epoch, 'epoch'), out=args.out)

    # Evaluate and report at each epoch's end and at the last iteration, so
    # that a run shorter than an epoch (--epoch 0.2) reports and logs too.
    def at_report(trainer):
        updater = trainer.updater
        return updater.is_new_epoch or updater.epoch_detail >= args.epoch

    evaluator = extensions.Evaluator(test_iter, model, device=device)
    trainer.extend(dist.create_multi_node_evaluator(evaluator, comm),
                   trigger=at_report)

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
        trainer.extend(extensions.LogReport(trigger=at_report))
        trainer.extend(extensions.PrintReport(
            ['epoch', 'main/loss', 'validation/main/loss', 'main/accuracy',
             'validation/main/accuracy', 'elapsed_time']))
        trainer.extend(extensions.ProgressBar(update_interval=10))

    if args.resume:
        try:
            snap.load(args.resume, trainer)
        except ValueError as e:  # raised on every rank alike
            raise UserError(e)

    # From here on (the data loaded in float32, the parameters made):
    # the links compute in 16 bits under mixed16 (minichain/links/_mixed16).
    with minichain.using_config('dtype', args.dtype):
        trainer.run()
    return trainer


if __name__ == '__main__':
    minichain.host.tune_malloc()  # reuse freed buffers (minichain.host)
    main()
