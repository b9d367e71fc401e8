"""What models/train_resnet50.py shows on rank 0: the log, the printed
table, the plots and the progress bar it extends the trainer with, and the
lines before the first iteration and after the last."""
import os

from minichain.training import extensions
from models import train_budget, train_checks


def add_reports(trainer, args, length, at_evaluation, per_epoch,
                global_batch):
    """Rank 0's log, printed table, plots, progress bar and graph."""
    # Logged with each evaluation: at the end of each epoch and of training.
    trainer.extend(extensions.observe_lr(), trigger=at_evaluation)
    trainer.extend(extensions.observe_value(
        'images_per_sec', lambda t: t.updater.images_per_sec()),
        trigger=at_evaluation)
    trainer.extend(extensions.LogReport(trigger=at_evaluation))
    trainer.extend(extensions.PrintReport([
        'epoch', 'iteration', 'lr', 'main/loss', 'main/accuracy',
        'validation/main/loss', 'validation/main/accuracy', 'images_per_sec',
        'elapsed_time']))
    if extensions.PlotReport.available():
        def plot_trigger(trainer):  # ten points an epoch (or a shorter
            # run), and one with each evaluation
            span = min(per_epoch, length.total or per_epoch)
            return trainer.updater.iteration % max(1, int(span // 10)) == 0 \
                or at_evaluation(trainer)
        for name in ('loss', 'accuracy'):
            trainer.extend(extensions.PlotReport(
                ['main/' + name, 'validation/main/' + name], 'iteration',
                trigger=plot_trigger, file_name=name + '.png'),
                name='plot_' + name)
    trainer.extend(extensions.ProgressBar(  # its length: the stop trigger's
        update_interval=10,
        entries=['main/loss', 'main/accuracy'],
        images_per_iteration=global_batch))
    if args.graph:
        trainer.extend(extensions.DumpGraph('main/loss', 'graph.dot'))


def print_start(train_iter, n_val, comm, args, peak, warmup, budget):
    """Rank 0's lines before the first iteration: the data, the rate and
    the time budget."""
    jobs = getattr(train_iter, 'n_processes', 0)
    print('{} training images per rank, {} validation images in all{}'.format(
        len(train_iter.dataset), n_val, '; {} loader process{} per rank'
        .format(jobs, '' if jobs == 1 else 'es') if jobs else ''))
    if budget is not None and budget.fixed:
        print('time budget {}: {:,} iterations, as the run that wrote the '
              'snapshot chose'.format(train_budget.minutes(budget.seconds),
                                      budget.length.total))
    elif budget is not None and budget.length.total is not None:
        print('time budget {}: {:,} iterations, as the run that wrote the '
              'snapshot planned, until the speed up to iteration {} '
              're-plans them'.format(train_budget.minutes(budget.seconds),
                                     budget.length.total, budget.replan_at))
    elif budget is not None:
        print('time budget {} (start-up, training, evaluation): the '
              'speed of iterations {}-{} plans the length, that of the '
              'next {:.0%} of the way re-plans it'.format(
                  train_budget.minutes(budget.seconds), budget.first + 1,
                  budget.last, train_budget.REPLAN_SHARE))
    print('peak lr {:.4g} ({} x {} / 256), {:g}-epoch warm-up ({} '
          'iterations), {} decay; output in {}'.format(
              peak, args.lr, args.batchsize * comm.size, args.warmup, warmup,
              args.schedule, args.out), flush=True)


def print_end(trainer, args, global_batch, n_val, result, budget=None):
    """Rank 0's summary: what was trained, the test accuracy, where the
    files are. ``budget``, a line on the time budget (what it allowed and
    what it chose), comes first when given."""
    up = trainer.updater
    lines = [] if budget is None else [budget]
    lines.append('done: {} iterations, {} images ({:.2f} epochs) in {}'
                 .format(up.iteration, up.iteration * global_batch,
                         up.epoch_detail,
                         train_budget.minutes(trainer.elapsed_time)))
    if result:
        lines.append('test accuracy {:.4f} (loss {:.4f}) over all {} '
                     'validation images'.format(
                         result['validation/main/accuracy'],
                         result['validation/main/loss'], n_val))
    plots = [os.path.join(args.out, n) for n in ('loss.png', 'accuracy.png')]
    lines.append('log:       {}\nplots:     {}\nsnapshots: {}'.format(
        os.path.join(args.out, 'log'), ', '.join(
            p for p in plots if os.path.exists(p)) or '(no matplotlib)',
        os.path.join(args.out, train_checks.SNAPSHOT.format(trainer))))
    print('\n'.join(lines), flush=True)
