#!/usr/bin/env python
"""Data-parallel ResNet training under mpiexec (ChainerMN's ImageNet example).

    mpiexec -n 2 python models/train_resnet50.py          # Fashion-MNIST, CPU
    mpiexec -n 8 python models/train_resnet50.py --data imagenet \\
        --data-dir /data/imagenet --device gpu

An ordinary trainer script plus the multi-node calls: create_communicator,
scatter_dataset, create_multi_node_optimizer, create_multi_node_evaluator and
multi_node_snapshot. Rank 0 draws the progress bar and writes the log, the
plots and the snapshots under --out (the last --keep of them). SIGTERM,
SIGINT, SIGUSR1 or SIGUSR2: every rank stops at the same iteration, rank 0
writes a snapshot, and the job exits with 128 + the signal number; --resume
continues exactly (and refuses a snapshot of other settings), and
--snapshot-every bounds what a launcher's SIGKILL can lose. Bad input ends
every rank with one line on stderr and a non-zero exit, before any work when
it can be seen: options, --out (writable, room for a snapshot), data; a
gradient that is inf or NaN stops training at once (--nan-check), keeping
the last good snapshot. The recipe is in README.md.
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
    threads per rank oversubscribe the cores). An explicit setting wins."""
    local = (os.environ.get('MPI_LOCALNRANKS')
             or os.environ.get('OMPI_COMM_WORLD_LOCAL_SIZE') or '')
    if local.isdigit() and int(local) > 1:
        threads = str(max(1, (os.cpu_count() or 1) // int(local)))
        for var in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS',
                    'MKL_NUM_THREADS'):
            os.environ.setdefault(var, threads)


_share_cores()

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minichain import backend, dist, initializers  # noqa: E402
from minichain import links as L  # noqa: E402
from minichain import optimizer_hooks, optimizers, serializers  # noqa
from minichain import host, training  # noqa: E402
from minichain.iterators import MultiprocessIterator  # noqa: E402
from minichain.iterators import SerialIterator  # noqa: E402
from minichain.training import extensions  # noqa: E402
from models import train_checks, train_data  # noqa: E402
from models.train_extensions import (LearningRate, Progress,  # noqa: E402
                                     StopOnSignal, TimedUpdater,
                                     catch_signals, extend_snapshots,
                                     snapshot_interval)
from models.resnet import ARCHS, STEMS, BasicBlock, Bottleneck, ResNet  # noqa
from models.train_data import UserError  # noqa: E402

PROG = 'train_resnet50.py'
# The default Fashion-MNIST run trains one pass over this many of the 60000
# training images: what fits in 15 minutes on a 2-core machine (README.md).
FASHION_SUBSET = 32000


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise UserError(message, status=2)


def parse_args(argv=None):
    """Parse and check the command line (same result on every rank)."""
    p = _Parser(prog=PROG, description=__doc__.split('\n')[0])
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
    a('--lr', type=float, help='learning rate per 256 images (default 0.4 '
      'for Fashion-MNIST, 0.1 otherwise); the peak is lr * global batch / 256')
    a('--warmup', type=float, default=None, help='linear warm-up in epochs')
    a('--schedule', choices=('cosine', 'step', 'linear'), default='cosine')
    a('--zero-gamma', action=argparse.BooleanOptionalAction, default=True,
      help="start each residual branch's last batch-norm scale at 0")
    a('--momentum', type=float, default=0.9)
    a('--weight-decay', type=float, default=1e-4)
    a('--communicator', choices=('flat', 'naive', 'pure_nccl',
                                 'hierarchical', 'auto'))
    a('--device', choices=('cpu', 'gpu', 'auto'), default='auto')
    a('--out', '-o', default='result')
    a('--keep', type=int, default=2, help='snapshots to keep in --out (the '
      'newest ones; default 2)')
    a('--resume', '-r', help='a snapshot written by this script')
    a('--seed', type=int, default=0)
    a('--snapshot-every', type=snapshot_interval, metavar='N|Nm|Nh',
      help='also snapshot every N iterations (or 30m, 2h...) between epochs; '
      'each such snapshot replaces the previous one')
    a('--nan-check', choices=('on', 'off'), default='on', help='stop at the '
      'first update whose averaged gradient holds inf or NaN (default on)')
    a('--graph', action='store_true', help='write the graph as out/graph.dot '
      '(and graph.png when Graphviz is installed)')
    a('--train-subset', type=int, help='train on a random N-image subset '
      '(Fashion-MNIST: {} by default, for the time budget)'.format(
          FASHION_SUBSET))
    a('--val-subset', type=int, help='evaluate on a random N-image subset')
    a('--image-size', type=int, help='crop size (ImageNet, default 224) or '
      'side of the synthetic images (default 32)')
    a('--loaderjob', '-j', type=int, help='worker processes per rank that '
      'read (decode) the images; 0 reads them in the training process. '
      "Default: for ImageNet on a GPU, the rank's share of the cores but one, "
      'else 0')
    args = p.parse_args(argv)
    # epochs, lr per 256 images, warm-up epochs, stem, training subset
    defaults = {'fashion-mnist': (1.0, 0.4, 0.1, 'small2', FASHION_SUBSET),
                'imagenet': (90.0, 0.1, 5.0, 'imagenet', None),
                'synthetic': (1.0, 0.1, 0.1, 'small2', None)}[args.data]
    if args.epoch is None and args.iteration is None:
        args.epoch = defaults[0]
    args.lr = defaults[1] if args.lr is None else args.lr
    args.warmup = defaults[2] if args.warmup is None else args.warmup
    args.stem = args.stem or defaults[3]
    args.train_limit = defaults[4]  # without --train-subset, when larger
    args.image_size = args.image_size or (224 if args.data == 'imagenet'
                                          else 32)
    for name in ('batchsize', 'val_batchsize', 'iteration', 'train_subset',
                 'val_subset', 'image_size', 'keep'):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError('--{} must be at least 1, got {}'.format(
                name.replace('_', '-'), value), status=2)
    # name: (low, high, low excluded); every value must also be finite
    for name, (low, high, low_open) in {
            'epoch': (0, None, True), 'lr': (0, None, True),
            'warmup': (0, None, False), 'momentum': (0, 1, False),
            'weight_decay': (0, None, False)}.items():
        value = getattr(args, name)
        if value is not None:
            train_checks.number(value, name.replace('_', '-'), low, high,
                                low_open)
    train_checks.number(args.seed, 'seed', 0, 2 ** 32, integer=True)
    if args.epoch is not None and args.epoch > 10 ** 6:
        raise UserError('--epoch {} is more than a million epochs'.format(
            args.epoch), status=2)
    if args.loaderjob is not None and args.loaderjob < 0:
        raise UserError('--loaderjob must be at least 0, got {}'.format(
            args.loaderjob), status=2)
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


# -- the run ------------------------------------------------------------------
def agree(comm, fn, *args):
    """``fn(*args)`` on every rank; a UserError on any rank is raised on all
    (naming the rank when it is not rank 0), so that no rank hangs."""
    try:
        result, error = fn(*args), None
    except UserError as e:
        result, error = None, (str(e), e.status)
    errors = comm.allgather_obj(error)
    for rank, err in enumerate(errors):
        if err is not None:
            prefix = '' if rank == 0 else '[rank {}] '.format(rank)
            raise UserError(prefix + err[0], status=err[1])
    return result


def on_root(comm, fn, *args):
    """``fn(*args)`` on rank 0 (the writer), agreed on by every rank."""
    return agree(comm, lambda: fn(*args) if comm.rank == 0 else None)


def setup(args, comm):
    """Device, data, model, optimizer and trainer of this rank."""
    on_root(comm, train_checks.check_out, args.out)
    device = agree(comm, train_data.get_device, args.device, comm.intra_rank,
                   comm.intra_size)
    train, val, n_classes, in_ch, converters = train_data.load(args, comm,
                                                               agree)
    agree(comm, train_data.check_shard, args, len(train), comm.size)
    initializers.set_random_seed(args.seed)
    model = ResNet(args.arch, n_classes, args.stem, in_ch)
    if args.zero_gamma:
        zero_last_gamma(model)
    if args.bn == 'sync' and comm.size > 1:
        model = dist.create_mnbn_model(model, comm)
    model = L.Classifier(model)
    on_root(comm, train_checks.check_free_space, args.out,
            train_checks.snapshot_bytes(model))
    model.to_device(device)
    global_batch = args.batchsize * comm.size
    opt = dist.create_multi_node_optimizer(optimizers.MomentumSGD(
        lr=args.lr, momentum=args.momentum), comm,
        nan_check=args.nan_check == 'on').setup(model)
    if args.weight_decay:
        opt.add_hook(optimizer_hooks.WeightDecay(args.weight_decay))
    comm.bcast_data(model)        # start equal, so that every update steps
    opt.needs_broadcast = False
    train_iter, val_iter = iterators(args, comm, train, val)
    updater = TimedUpdater(train_iter, opt, converter=converters[0],
                           device=device,
                           images_per_update=global_batch, seed=args.seed,
                           rank=comm.rank)
    per_epoch = len(train) / args.batchsize
    total = (args.iteration if args.iteration is not None
             else math.ceil(args.epoch * per_epoch))
    stop = StopOnSignal((args.iteration, 'iteration') if args.iteration
                        else (args.epoch, 'epoch'), comm)
    trainer = training.Trainer(updater, stop, out=args.out)
    peak = args.lr * global_batch / 256
    trainer.extend(LearningRate(peak, round(args.warmup * per_epoch), total,
                                args.schedule), trigger=(1, 'iteration'))
    evaluator = extensions.Evaluator(val_iter, model, converter=converters[1],
                                     device=device)
    trainer.extend(dist.create_multi_node_evaluator(evaluator, comm),
                   trigger=(1, 'epoch'))
    name = train_checks.SNAPSHOT
    snap = dist.multi_node_snapshot(comm, extensions.snapshot(  # float
        filename=name, n_retains=args.keep,  # data hardly shrinks
        savefun=lambda path, obj: serializers.save_npz(path, obj, False)))
    extend_snapshots(trainer, snap, name, (1, 'epoch'), args.snapshot_every,
                     comm, before=train_checks.FiniteGuard(comm, args.out),
                     remove_stale=False)  # removed below, with the log's
    run_settings = train_checks.settings(args, converters[3])
    trainer.extend(train_checks.RunSettings(run_settings))
    if converters[2] is not None:  # unreadable images, summed over ranks
        trainer.extend(extensions.observe_value(
            'skipped_images', lambda t: comm.allreduce_obj(converters[2]())))
    if comm.rank == 0:
        add_reports(trainer, updater, total, per_epoch)
        if args.graph:
            trainer.extend(extensions.DumpGraph('main/loss', 'graph.dot'))
    if args.resume:
        on_root(comm, train_checks.check_resume, args.resume, run_settings)
        agree(comm, _resume, snap, args.resume, trainer)
    if comm.rank == 0:
        removed = train_checks.remove_stale_temporaries(args.out)
        if removed:
            print('removed {} temporary file{} of interrupted writes from {}'
                  .format(len(removed), 's' if len(removed) > 1 else '',
                          args.out), flush=True)
    return trainer, evaluator, snap, stop, peak


def iterators(args, comm, train, val):
    """The training and validation iterators: SerialIterator, or with
    ``--loaderjob N`` a MultiprocessIterator (same batches and snapshot
    keys) whose N workers decode while the step runs. By default only
    ImageNet on a GPU uses workers, one per core of the rank's share but
    the training process's: array data has nothing to decode, and on the
    CPU the step already keeps every core of the rank busy."""
    jobs = args.loaderjob
    if jobs is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(
            os, 'sched_getaffinity') else (os.cpu_count() or 1)
        jobs = max(1, cores // comm.intra_size - 1) if (
            args.data == 'imagenet' and args.device == 'gpu') else 0
    if not jobs:
        return (SerialIterator(train, args.batchsize, seed=args.seed),
                SerialIterator(val, args.val_batchsize, repeat=False,
                               shuffle=False))
    return (MultiprocessIterator(train, args.batchsize, seed=args.seed,
                                 n_processes=jobs, n_prefetch=2),
            MultiprocessIterator(val, args.val_batchsize, repeat=False,
                                 shuffle=False, n_processes=jobs))


def _resume(snap, path, trainer):
    try:
        snap.load(path, trainer)
    except ValueError as e:
        raise UserError(str(e))


def train(trainer, comm, out):
    """``trainer.run()``; an error that one rank meets (an unreadable batch)
    is raised on every rank, and a non-finite gradient or a snapshot that
    cannot be written stops training with one line."""
    try:
        trainer.run()
    except UserError as e:
        if not getattr(e, 'raised_on_every_rank', False):
            comm.raise_everywhere(e)
        raise
    except dist.NonFiniteGradientError as e:
        raise UserError('{}; {}'.format(e, train_checks.describe_last(out)))
    except OSError as e:  # a snapshot rank 0 could not write, say
        if not getattr(e, 'raised_on_every_rank', False):
            raise
        raise UserError('{}; {}'.format(e, train_checks.describe_last(out)))


def add_reports(trainer, updater, total, per_epoch):
    """Rank 0's log, printed table, plots and progress bar."""
    trainer.extend(extensions.observe_lr())
    trainer.extend(extensions.observe_value(
        'images_per_sec', lambda t: updater.pop_images_per_sec()))
    progress = Progress(total)
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PrintReport([
        'epoch', 'iteration', 'lr', 'main/loss', 'main/accuracy',
        'validation/main/loss', 'validation/main/accuracy', 'images_per_sec',
        'elapsed_time'], out=progress))
    if extensions.PlotReport.available():
        every = training.get_trigger((max(1, int(per_epoch // 10)),
                                      'iteration'))

        def plot_trigger(trainer):  # every tenth of an epoch and at its end
            return every(trainer) or trainer.updater.is_new_epoch
        for name in ('loss', 'accuracy'):
            trainer.extend(extensions.PlotReport(
                ['main/' + name, 'validation/main/' + name], 'iteration',
                trigger=plot_trigger, file_name=name + '.png'),
                name='plot_' + name)
    trainer.extend(progress, trigger=(1, 'iteration'))


def run(args, comm):
    """Train; return the exit status."""
    if comm.rank == 0:
        print('{} on {} ({} process{}, {} communicator, {}), batch {} per '
              'rank'.format(args.arch, args.data, comm.size,
                            '' if comm.size == 1 else 'es', comm.name,
                            args.device, args.batchsize), flush=True)
    trainer, evaluator, snap, stop, peak = setup(args, comm)
    n_val = comm.allreduce_obj(len(evaluator.get_iterator().dataset))
    if comm.rank == 0:
        it = trainer.updater.get_iterator()
        print('{} training images per rank, {} validation images in all{}'
              .format(len(it.dataset), n_val, '; {} loader process{} per '
                      'rank'.format(it.n_processes, '' if it.n_processes == 1
                                    else 'es') if isinstance(
                          it, MultiprocessIterator) else ''))
        print('peak lr {:.4g} ({} x {} / 256), {} warm-up, {} decay; output '
              'in {}'.format(peak, args.lr, args.batchsize * comm.size,
                             args.warmup, args.schedule, args.out), flush=True)
    train(trainer, comm, args.out)
    it = trainer.updater.iteration
    if snap.last_iteration != it:
        train_checks.FiniteGuard(comm, args.out)(trainer)
        snap(trainer)
    path = os.path.join(args.out, 'snapshot_iter_{}'.format(it))
    if stop.signum:
        if comm.rank == 0:
            print('\nstopped by {} at iteration {}; snapshot {}\nresume with: '
                  '--resume {}'.format(signal.Signals(stop.signum).name, it,
                                       path, path), flush=True)
        return 128 + stop.signum
    result = None
    if not trainer.updater.is_new_epoch:  # the last evaluation is stale
        result = evaluator.evaluate()
    if comm.rank == 0:
        log = trainer.get_extension('LogReport').log
        if result is None and log:
            result = log[-1]
        print('\ndone: {} iterations ({:.2f} epochs) in {:.0f} s'.format(
            it, trainer.updater.epoch_detail, trainer.elapsed_time))
        if result:
            print('test accuracy {:.4f} (loss {:.4f}) over all {} validation '
                  'images'.format(result['validation/main/accuracy'],
                                  result['validation/main/loss'], n_val))
        plots = [os.path.join(args.out, n) for n in ('loss.png',
                                                     'accuracy.png')]
        print('log:       {}\nplots:     {}\nsnapshots: {}'.format(
            os.path.join(args.out, 'log'), ', '.join(
                p for p in plots if os.path.exists(p)) or '(no matplotlib)',
            path), flush=True)
    return 0


def main(argv=None):
    """Entry point: returns the exit status (bad input: one line, rank 0)."""
    catch_signals()
    rank = train_data.launcher_rank()
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
        return run(args, comm)
    except UserError as e:  # raised on every rank alike (see agree)
        if rank == 0:
            sys.stderr.write('{}: error: {}\n'.format(PROG, e))
            sys.stderr.flush()
        return e.status


if __name__ == '__main__':
    host.tune_malloc()  # reuse freed activation buffers (minichain.host)
    sys.exit(main())
