#!/usr/bin/env python
"""Data-parallel ResNet training under mpiexec (ChainerMN's ImageNet example).

From the repository root:

    mpiexec -n 2 python -m models.train_resnet50          # Fashion-MNIST, CPU
    mpiexec -n 8 python -m models.train_resnet50 --data imagenet \\
        --data-dir /data/imagenet --device gpu

An ordinary trainer script plus the multi-node calls: create_communicator,
scatter_dataset, create_multi_node_optimizer, create_multi_node_evaluator
and multi_node_snapshot. Rank 0 draws the progress bar and writes the log,
the plots and the snapshots under --out. A stop signal (SIGTERM, SIGINT,
SIGUSR1, SIGUSR2) stops every rank at the same iteration with a snapshot
(exit 128 + the signal); --resume continues exactly. Bad input ends every
rank with one line on stderr (models/train_checks.py). The options, the
recipe and the figures: models/README.md.
"""
import argparse
import math
import os
import signal
import sys
import warnings


def _share_cores():
    """Give each rank of this node its share of the cores as BLAS threads,
    before NumPy starts them (mpiexec puts ranks side by side; unlimited
    threads per rank oversubscribe the cores), and oneDNN's OpenMP threads
    as many (OMP_NUM_THREADS), sleeping rather than spinning while they
    wait: beside NumPy's threads and another rank, libgomp's default spin
    (300,000 turns, ~3 ms) made a ResNet-50 step 2.8x slower. But each
    oneDNN call then wakes a sleeping thread: a spin of 10,000 turns
    (~0.1 ms, about the Python between two calls) made a 2-thread step
    at 32 x 28 1.15x faster in float32, 1.25x in bf16 (bench/README.md,
    "oneDNN kernels"). An explicit setting wins."""
    os.environ.setdefault('OMP_WAIT_POLICY', 'passive')
    os.environ.setdefault('GOMP_SPINCOUNT', '10000')
    local = (os.environ.get('MPI_LOCALNRANKS')
             or os.environ.get('OMPI_COMM_WORLD_LOCAL_SIZE') or '')
    if local.isdigit() and int(local) > 1:
        threads = str(max(1, (os.cpu_count() or 1) // int(local)))
        for var in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS',
                    'MKL_NUM_THREADS'):
            os.environ.setdefault(var, threads)


_share_cores()
if not __package__:  # run as a file: `import models` would fail below
    sys.exit('run it from the repository root as: python -m '
             'models.train_resnet50 [options]')

import minichain  # noqa: E402
from minichain import backend, dist, initializers  # noqa: E402
from minichain import links as L  # noqa: E402
from minichain import optimizers, serializers  # noqa
from minichain import host, training  # noqa: E402
from minichain.training import extensions, triggers  # noqa: E402
from models import train_budget, train_checks, train_data  # noqa: E402
from models.train_reports import add_reports, print_end, print_start  # noqa
from models.resnet import ARCHS, STEMS, BasicBlock, Bottleneck, ResNet  # noqa
from models.train_checks import UserError, agree, on_root  # noqa: E402

PROG = 'train_resnet50.py'
# Without a length (--epoch, --iteration, --train-subset), Fashion-MNIST
# trains for as many images as fit this many minutes (start-up and
# evaluation included), so that `make train` ends within 15 minutes on any
# machine (models/README.md).
TIME_BUDGET = 13.0
# --overlap auto: average gradient buckets while backward runs where that is
# not slower. CPU: on, since bench/scaling.py --overlap (2 ranks x batch 8,
# ResNet-50 at 224) measured it at 1.03x the throughput of averaging after
# backward, with less communication left after backward (bench/README.md).
# GPU: on, as PyTorch DDP's default (NCCL on a side stream); not measured
# here for want of a GPU (bench/gpu_check.sh runs tests/dist/test_gpu.py's
# overlap test).
OVERLAP_BY_DEVICE = {'cpu': True, 'gpu': True}


def parse_args(argv=None):
    """Parse and check the command line (same result on every rank)."""
    p = train_checks.Parser(prog=PROG, description=__doc__.split('\n')[0])
    a = p.add_argument
    a('--data', choices=('fashion-mnist', 'imagenet', 'synthetic'),
      default='fashion-mnist')
    a('--data-dir', help='Fashion-MNIST IDX folder, or the ImageNet root '
      'holding train/<class>/* and val/<class>/*')
    a('--arch', choices=sorted(ARCHS), default='resnet50')
    a('--stem', choices=STEMS, help="default: 'imagenet' for ImageNet, "
      "'small2' (3x3 stride-2 conv, no max-pool) otherwise")
    a('--bn', choices=('sync', 'local'), default='local',
      help='batch norm over the global batch (sync) or per rank (local)')
    a('--batchsize', '-b', type=int, default=32, help='images per rank')
    a('--val-batchsize', type=int, default=200)
    g = p.add_mutually_exclusive_group()
    g.add_argument('--epoch', '-e', type=float)
    g.add_argument('--iteration', '-i', type=int)
    g.add_argument('--time-budget', type=float, metavar='MIN', help='train '
                   'as many iterations as fit MIN minutes (start-up and '
                   'evaluation included), fixed from the speed of the first '
                   'iterations '
                   '(Fashion-MNIST without a length: {:g})'.format(
                       TIME_BUDGET))
    a('--lr', type=float, help='learning rate per 256 images (default 0.4 '
      'for Fashion-MNIST, 0.1 otherwise); the peak is lr * global batch / 256')
    a('--warmup', type=float, default=None, help='linear warm-up in epochs '
      '(default 0.05 for Fashion-MNIST, 5 for ImageNet, 0.1 otherwise)')
    a('--schedule', choices=('cosine', 'step', 'linear'), default='cosine')
    a('--zero-gamma', action=argparse.BooleanOptionalAction, default=True,
      help="start each residual branch's last batch-norm scale at 0")
    a('--momentum', type=float, default=0.9)
    a('--weight-decay', type=float, default=1e-4)
    a('--communicator', choices=('flat', 'naive', 'pure_nccl',
                                 'hierarchical', 'auto'))
    a('--device', choices=('cpu', 'gpu', 'auto'), default='auto')
    a('--overlap', choices=('on', 'off', 'auto'), default='auto',
      help='average gradients in buckets while backward still runs (auto: '
      'on where that is not slower, see models/README.md; never with the '
      'naive communicator)')
    a('--bucket-mb', type=float, help='with --overlap: MiB of gradients per '
      'bucket (default 25, as PyTorch DDP)')
    a('--out', '-o', default='result')
    a('--keep', type=int, default=2, help='snapshots to keep in --out (the '
      'newest ones; default 2)')
    a('--resume', '-r', help='a snapshot written by this script')
    a('--seed', type=int, default=0)
    a('--snapshot-every', type=extensions.parse_interval, metavar='N|Nm|Nh',
      help='also snapshot every N iterations (or 30m, 2h...) between epochs; '
      'each such snapshot replaces the previous one')
    a('--precision', choices=('auto', 'bf16', 'float32', 'mixed16'),
      default='auto',
      help="the products' math (config.fp32_math): 'auto' computes the "
      'convolutions with bfloat16 factors and float32 sums where oneDNN '
      'has bfloat16 instructions (AVX512_BF16, AMX) on the CPU, else '
      "float32; 'bf16' asks for it anywhere (TF32 on a GPU); 'mixed16' is "
      "Chainer's (config.dtype): float32 parameters, bfloat16 activations "
      'on the CPU, float16 ones with dynamic loss scaling on a GPU')
    a('--nan-check', choices=('on', 'off'), default='on', help='stop at the '
      'first update whose averaged gradient holds inf or NaN (default on)')
    a('--graph', action='store_true', help='write the graph as out/graph.dot '
      '(and graph.png when Graphviz is installed)')
    a('--train-subset', type=int, help='train on a random N-image subset '
      '(one epoch of it unless --epoch, --iteration or --time-budget says '
      'otherwise)')
    a('--val-subset', type=int, help='evaluate on a random N-image subset')
    a('--image-size', type=int, help='crop size (ImageNet, default 224) or '
      'side of the synthetic images (default 32)')
    a('--loaderjob', '-j', type=int, help='worker processes per rank that '
      'read (decode) the images; 0 reads them in the training process. '
      "Default: for ImageNet on a GPU, the rank's share of the cores but one, "
      'else 0')
    args = p.parse_args(argv)
    # epochs, lr per 256 images, warm-up epochs, stem
    # (Fashion-MNIST's warm-up: 3000 images, about the tuned recipe's share
    # of a budgeted run; models/README.md)
    defaults = {'fashion-mnist': (1.0, 0.4, 0.05, 'small2'),
                'imagenet': (90.0, 0.1, 5.0, 'imagenet'),
                'synthetic': (1.0, 0.1, 0.1, 'small2')}[args.data]
    if args.epoch is None and args.iteration is None and \
            args.time_budget is None:
        if args.data == 'fashion-mnist' and args.train_subset is None:
            args.time_budget = TIME_BUDGET
        else:
            args.epoch = defaults[0]
    args.lr = defaults[1] if args.lr is None else args.lr
    args.warmup = defaults[2] if args.warmup is None else args.warmup
    args.stem = args.stem or defaults[3]
    if args.image_size is None:  # 0 is refused below, not replaced
        args.image_size = 224 if args.data == 'imagenet' else 32
    train_checks.check_args(args)
    return args


def zero_last_gamma(model):
    """Set the scale of each residual branch's last batch norm to 0, so
    that every block starts as the identity (Goyal et al., 2017, 5.1):
    without it ResNet-50's loss blows up in its first iterations here."""
    for _, link in model.namedlinks():
        if isinstance(link, Bottleneck):
            link.bn3.gamma.array[...] = 0
        elif isinstance(link, BasicBlock):
            link.bn2.gamma.array[...] = 0


def main(argv=None):
    """Entry point: returns the exit status (bad input: one line, rank 0)."""
    triggers.catch_stop_signals()
    rank = train_checks.launcher_rank()
    warnings.formatwarning = lambda m, c, f, n, line=None: (
        '[rank {}] warning: {}\n'.format(rank, m))
    try:
        args = parse_args(argv)
        if args.device == 'auto':
            args.device = 'gpu' if backend.gpu_available() else 'cpu'
        if args.device == 'cpu' and args.communicator in ('pure_nccl',
                                                          'hierarchical'):
            raise UserError('--communicator {} needs a GPU (--device gpu)'
                            .format(args.communicator), status=2)
        name = args.communicator
        if name in (None, 'auto'):  # 'auto': pure_nccl when NCCL works
            name = 'auto' if args.device == 'gpu' else 'flat'
        try:
            comm = dist.create_communicator(name)
        except (ImportError, ValueError, RuntimeError) as e:
            raise UserError(e)
        rank = comm.rank
        args.overlap = use_overlap(args, comm)
        return train(args, comm)
    except UserError as e:  # raised on every rank alike (see agree)
        if rank == 0:
            sys.stderr.write('{}: error: {}\n'.format(PROG, e))
            sys.stderr.flush()
        return e.status


def use_overlap(args, comm):
    """Whether to overlap the averaging with backward (``--overlap``)."""
    if args.overlap == 'auto':
        return comm.can_overlap and OVERLAP_BY_DEVICE[args.device]
    if args.overlap == 'on' and not comm.can_overlap:
        raise UserError('--overlap on: the {} communicator cannot overlap '
                        '(use flat, pure_nccl or hierarchical)'.format(
                            comm.name), status=2)
    return args.overlap == 'on'


def precision(args):
    """(``config.fp32_math`` for ``--precision``, the header's words)."""
    if args.precision == 'float32':
        return 'strict', 'float32'
    if args.precision == 'bf16':
        return 'bf16', 'bf16 compute'
    if args.precision == 'mixed16':
        return 'strict', 'mixed16 ({} activations)'.format(
            'bfloat16' if args.device == 'cpu' else 'float16')
    if args.device != 'cpu':
        return 'strict', 'float32'
    from minichain.kernels import onednn
    has, isa = onednn.bf16_compute()
    if has:
        return 'bf16', 'bf16 compute ({})'.format(isa)
    if isa.startswith('oneDNN'):
        return 'strict', 'float32 ({})'.format(isa)
    return 'strict', 'float32 ({}: no bfloat16 instructions)'.format(isa)


def train(args, comm):
    """Train on every rank; returns the exit status."""
    # every rank asks its own CPU; they agree on a cluster of one kind
    products, words = precision(args)
    minichain.config.fp32_math = products   # this (the training) thread's
    if args.precision == 'mixed16':
        minichain.config.dtype = 'mixed16'
    if comm.rank == 0:
        print('{} on {} ({} process{}, {} communicator{}, {}), batch {} per '
              'rank, {}'.format(args.arch, args.data, comm.size,
                                '' if comm.size == 1 else 'es', comm.name,
                                ', overlapped' if args.overlap else '',
                                args.device, args.batchsize, words),
              flush=True)
    on_root(comm, train_checks.check_out, args.out)
    device = agree(comm, train_data.get_device, args.device, comm.intra_rank,
                   comm.intra_size)

    # Rank 0 reads arrays and scatters them; ImageNet is listed per rank.
    train_set, val_set, n_classes, channels, converters = train_data.load(
        args, comm)
    agree(comm, train_data.check_shard, args, len(train_set), comm.size)

    initializers.set_random_seed(args.seed)
    model = ResNet(args.arch, n_classes, args.stem, channels)
    if args.zero_gamma:
        zero_last_gamma(model)
    if args.bn == 'sync' and comm.size > 1:
        model = dist.create_mnbn_model(model, comm)
    model = L.Classifier(model)
    on_root(comm, train_checks.check_free_space, args.out,
            train_checks.snapshot_bytes(model))
    model.to_device(device)

    # Weight decay in the rule, not as a WeightDecay hook: the same numbers,
    # and a kernel can fold it into the update's one pass over the arrays.
    optimizer = dist.create_multi_node_optimizer(
        optimizers.MomentumSGD(lr=args.lr, momentum=args.momentum,
                               weight_decay_rate=args.weight_decay), comm,
        nan_check=args.nan_check == 'on', overlap=args.overlap,
        bucket_mb=args.bucket_mb).setup(model)
    if args.precision == 'mixed16' and args.device != 'cpu':
        optimizer.actual_optimizer.loss_scaling()  # float16's range
    optimizer.broadcast_params()  # start equal: the first update steps too

    train_iter, val_iter = train_data.iterators(args, comm, train_set,
                                                val_set)
    global_batch = args.batchsize * comm.size
    updater = train_data.Updater(
        train_iter, optimizer, converter=converters[0], device=device,
        seed=(args.seed, comm.rank), images=global_batch)
    per_epoch = len(train_set) / args.batchsize
    warmup = round(args.warmup * per_epoch)
    n_val = comm.allreduce_obj(len(val_set))
    if args.time_budget:  # the length is fixed after a few iterations
        length = train_budget.Length()
        measure = agree(comm, budget_window, args, warmup, per_epoch)
    else:
        length = train_budget.Length(
            args.iteration if args.iteration is not None
            else math.ceil(args.epoch * per_epoch))
    stop = triggers.StopOnSignal(length, comm)
    trainer = training.Trainer(updater, stop, out=args.out)

    peak = args.lr * global_batch / 256
    # Under a time budget the length is not known yet: any will do until
    # it is, since the iterations before lie in the warm-up
    # (models/train_budget.py).
    shift = extensions.WarmupDecayShift(
        'lr', peak, length.total or warmup, warmup=warmup,
        decay=args.schedule)
    trainer.extend(shift)
    budget = None
    if args.time_budget:
        budget = train_budget.TimeBudget(
            args.time_budget * 60, length, shift, measure, args.batchsize,
            n_val, per_epoch, train_checks.snapshot_bytes(model),
            args.snapshot_every, comm)
        trainer.extend(budget)

    def at_evaluation(trainer):  # each epoch's end and the last iteration
        return trainer.updater.is_new_epoch or length(trainer)
    evaluator = extensions.Evaluator(val_iter, model, converter=converters[1],
                                     device=device,
                                     progress_bar=comm.rank == 0)
    trainer.extend(dist.create_multi_node_evaluator(evaluator, comm),
                   trigger=at_evaluation)
    # Every rank takes part in a snapshot; rank 0 writes it (float data
    # hardly shrinks: stored, not compressed).
    snap = dist.multi_node_snapshot(comm, extensions.snapshot(
        filename=train_checks.SNAPSHOT, n_retains=args.keep,
        savefun=lambda path, obj: serializers.save_npz(path, obj, False)))
    guard = train_checks.FiniteGuard(comm, args.out)
    extensions.extend_snapshots(trainer, snap, train_checks.SNAPSHOT,
                                (1, 'epoch'), args.snapshot_every, comm,
                                before=guard, remove_stale=False)
    settings = train_checks.settings(args, converters[3])
    trainer.extend(train_checks.RunSettings(settings))
    if converters[2] is not None:  # unreadable images, summed over ranks
        trainer.extend(extensions.observe_value(
            'skipped_images', lambda t: comm.allreduce_obj(converters[2]())),
            trigger=at_evaluation)

    # Reports are for one rank only (otherwise every line comes N times).
    if comm.rank == 0:
        add_reports(trainer, args, length, at_evaluation, per_epoch,
                    global_batch)

    if args.resume:
        train_checks.resume(comm, snap, args.resume, trainer, settings)
    if comm.rank == 0:
        removed = train_checks.remove_stale_temporaries(args.out)
        if removed:
            print('removed {} temporary file{} of interrupted writes from {}'
                  .format(len(removed), 's' if len(removed) > 1 else '',
                          args.out), flush=True)
    if comm.rank == 0:
        print_start(train_iter, n_val, comm, args, peak, warmup, budget)
    train_checks.run(trainer, comm, args.out)

    if snap.last_iteration != trainer.updater.iteration:  # the last one
        guard(trainer)
        snap(trainer)
    if stop.signum:
        if comm.rank == 0:
            path = os.path.join(args.out, train_checks.SNAPSHOT.format(
                trainer))
            print('\nstopped by {} at iteration {}; snapshot {}\nresume '
                  'with: --resume {}'.format(
                      signal.Signals(stop.signum).name,
                      trainer.updater.iteration, path, path), flush=True)
        return 128 + stop.signum
    if comm.rank == 0:  # the last entry holds the last evaluation
        log = trainer.get_extension('LogReport').log
        print_end(trainer, args, global_batch, n_val, log[-1] if log else
                  None, budget and budget.summary(trainer.elapsed_time))
    return 0


def budget_window(args, warmup, per_epoch):
    """The iterations a time budget measures (inside the warm-up)."""
    measure = train_budget.window(warmup)
    if measure is None:
        least = train_budget.SKIP + 2
        raise UserError(
            '--time-budget times iterations of the warm-up, but --warmup {:g} '
            'is {} iteration{}: give --warmup {:.3g} or more ({} iterations), '
            'or a length (--epoch, --iteration)'.format(
                args.warmup, warmup, '' if warmup == 1 else 's',
                math.ceil(1000 * least / per_epoch) / 1000, least), status=2)
    return measure


if __name__ == '__main__':
    host.tune_malloc()  # reuse freed activation buffers (minichain.host)
    sys.exit(main())
