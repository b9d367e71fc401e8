"""Weak scaling of the ResNet training step over MPI ranks on this machine.

Runs the same data-parallel training step (forward, softmax cross-entropy,
backward, gradient averaging, MomentumSGD; float32) under ``mpiexec -n 1``
and ``mpiexec -n 2`` (it launches them itself), one BLAS thread per rank,
a fixed batch per rank, and prints:

- seconds per step (the slowest rank's, median over all timed steps) and
  images per second for each rank count;
- weak-scaling efficiency = throughput(N) / (N x throughput(1));
- the share of a step spent in ``comm.multi_node_mean_grad``, split into
  the allreduce itself and the wait for the slower rank (a barrier just
  before it, timed apart), and the allreduce's bus bandwidth;
- when PyTorch is importable here: PyTorch running the same network with
  as many threads as the largest rank count, in one process, on the same
  global batch, and the ratio minichain (N ranks) / PyTorch;
- the CPU seconds per step of the busiest rank and the efficiency they
  imply, cpu(1) / cpu(N): what the wall clock would show with a core per
  rank and nothing else running (MPICH polls while it waits, so waiting
  still counts);
- the 1-minute load average as each run starts: other jobs on the cores
  slow the runs unevenly (PyTorch's threads, which wait for each other, most);
- round by round, the efficiency and the ratio to PyTorch, and their
  medians: the headline figures;
- the ceiling: the largest rank count again, each rank stepping on its own
  (no gradient averaging), started together by a barrier as the real ranks
  are. Its efficiency is what that many busy cores allow on this machine
  (they share caches and memory bandwidth); the gap down to the real
  efficiency is what the averaging costs (``--no-ceiling`` skips it).

Every configuration (each rank count, PyTorch) is a live worker that warms
up once and then takes one step per round, in turns (``_interleave.py``):
the steps of one round are seconds apart, so that the machine's drift (10%
or more between minutes here) hits every configuration of a round alike.
``--repeat K`` starts fresh workers K times and pools their rounds.

    python bench/scaling.py [--ranks 1,2] [--arch resnet50] [--batch 8]
        [--size 224] [--stem imagenet] [--steps 5] [--warmup 1] [--repeat 1]
        [--overlap [--progress poll,nodes,async] [--bucket-mb 25]]

(``--overlap``: the largest rank count again with overlapped averaging, per
progress mode, and the exposed communication of both paths; bench/README.md)

Run it with .venv-bench's Python (``make bench``) to get the PyTorch
column. The ranks need mpi4py: when this Python lacks it they run under
the project's .venv Python instead (its mpiexec too), with this source
tree on PYTHONPATH. ``$MINICHAIN_MPIEXEC`` chooses another launcher
(minichain.dist.launcher).
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, ROOT)
import _interleave  # noqa: E402
from _scaling_rank import run_rank  # noqa: E402
from _torch_models import have_torch, torch_step  # noqa: E402
from minichain.dist import launcher  # noqa: E402
ONE_THREAD = {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1',
              'MKL_NUM_THREADS': '1', 'MINICHAIN_HOST_THREADS': '1'}


# --- the workers ---------------------------------------------------------
def run_torch_worker(args):
    """PyTorch in one process with ``args.torch_threads`` threads, serving
    steps on the global batch of the largest rank count."""
    step = torch_step(args.arch, args.stem, args.batch, args.size,
                      args.torch_threads)
    _interleave.serve(step, args.warmup, lambda: {
        'rss_mib': resource.getrusage(
            resource.RUSAGE_SELF).ru_maxrss / 1024.0})


# --- the driver ----------------------------------------------------------
def _has_mpi4py(python):
    return subprocess.run([python, '-c', 'import mpi4py'],
                          capture_output=True).returncode == 0


def rank_python():
    """A Python that has mpi4py: this one, else the project's .venv."""
    if _has_mpi4py(sys.executable):
        return sys.executable
    venv = os.path.join(ROOT, '.venv', 'bin', 'python')
    if os.path.exists(venv) and _has_mpi4py(venv):
        return venv
    raise SystemExit('scaling.py: no Python with mpi4py found (tried {} and '
                     '{}); pip install mpi4py mpich'.format(sys.executable,
                                                            venv))


def mpiexec_for(n, python):
    """minichain.dist.launcher's command for ``n`` ranks of ``python``
    (``$MINICHAIN_MPIEXEC``, else the mpiexec beside ``python``, else on
    PATH)."""
    try:
        return launcher.mpiexec_command(n, python=python)
    except launcher.LauncherNotFound as e:
        raise SystemExit('scaling.py: {}'.format(e))


def launch(n, args, python, no_comm=False, progress=None):
    """A warmed-up MPI job of ``n`` ranks serving steps (a Worker); with
    ``no_comm`` the ranks skip the gradient averaging (the ceiling), and
    the worker is named 'ceiling' instead of ``n``; with ``progress`` they
    average with overlap, progressed that way (``_scaling_rank``), and the
    worker is named e.g. '2+nodes'."""
    env = dict(os.environ, **ONE_THREAD)
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT] + [p for p in [env.get('PYTHONPATH')] if p])
    cmd = mpiexec_for(n, python) + [python, os.path.abspath(
        __file__), '--rank', '--arch', args.arch, '--batch', str(args.batch),
        '--size', str(args.size), '--stem', args.stem, '--warmup',
        str(args.warmup), '--communicator', args.communicator]
    name = n
    if no_comm:
        cmd.append('--no-comm')
        name = 'ceiling'
    if progress:
        cmd += ['--rank-progress', progress]
        if args.bucket_mb is not None:
            cmd += ['--bucket-mb', str(args.bucket_mb)]
        if progress == 'async':  # MPICH's progress thread
            env['MPIR_CVAR_ASYNC_PROGRESS'] = '1'
        name = '{}+{}'.format(n, progress)
    return _interleave.Worker(name, cmd, ranks=n, env=env,
                              timeout=args.timeout)


def launch_torch(args, batch, threads):
    """A warmed-up PyTorch worker on ``batch`` images with ``threads``."""
    cmd = [sys.executable, os.path.abspath(__file__), '--torch-worker',
           '--arch', args.arch, '--batch', str(batch), '--size',
           str(args.size), '--stem', args.stem, '--warmup', str(args.warmup),
           '--torch-threads', str(threads)]
    return _interleave.Worker('torch', cmd, timeout=args.timeout)


def summarize(n, batch, res):
    """Per-step maxima over ranks, then medians: a dict of figures."""
    ranks = res['ranks']

    def slowest(key):
        return [max(r[key][i] for r in ranks)
                for i in range(len(ranks[0][key]))]

    step = statistics.median(slowest('step'))
    cpu = statistics.median(slowest('cpu'))
    # Averaged over ranks (of each rank's median): only the faster waits.
    wait = statistics.fmean(statistics.median(r['wait']) for r in ranks)
    mean = statistics.fmean(statistics.median(r['mean']) for r in ranks)
    bus = (res['grad_bytes'] * 2 * (n - 1) / n / mean) if mean > 0 else 0.0
    return {'n': n, 'step': step, 'cpu': cpu, 'img_s': n * batch / step,
            'wait': wait, 'mean': mean, 'bus_GBps': bus / 1e9,
            'rss_mib': max(r['rss_mib'] for r in ranks),
            'grad_bytes': res['grad_bytes']}


def measure(args, counts, python, use_torch):
    """Run every configuration as a live worker, ``args.steps`` rounds of
    one step each, ``args.repeat`` times (fresh workers each time).

    Returns:
        (rows, torch_row, rounds, ceiling, overlapped): a summary per rank
        count over all timed steps, PyTorch's ``(median s/step, threads,
        peak MiB)`` or None, each round's images per second by
        configuration ({n: ..., 'torch': ..., 'ceiling': ..., '2+nodes':
        ...}: the figures of one round are seconds apart), the ceiling's
        summary or None, and a summary per overlapped job.
    """
    threads = args.torch_threads or max(counts)
    gbatch = max(counts) * args.batch
    modes = ([m for m in args.progress.split(',') if m]
             if args.overlap and max(counts) > 1 else [])
    ovl = ['{}+{}'.format(max(counts), m) for m in modes]
    images = dict({n: n * args.batch for n in counts}, torch=gbatch,
                  ceiling=gbatch, **{name: gbatch for name in ovl})
    use_ceiling = args.ceiling and max(counts) > 1
    merged, torch_times, torch_rss, rounds = {}, [], 0.0, []
    for _ in range(args.repeat):
        load = os.getloadavg()[0]
        workers = []
        try:
            for n in counts:
                workers.append(launch(n, args, python))
            for mode in modes:
                workers.append(launch(max(counts), args, python,
                                      progress=mode))
            if use_ceiling:
                workers.append(launch(max(counts), args, python, True))
            if use_torch:
                workers.append(launch_torch(args, gbatch, threads))
            turns = _interleave.take_turns(workers, args.steps, args.gap)
            results = {w.name: w.finish() for w in workers}
        finally:
            for w in workers:
                w.close()
        for n in counts + ovl + (['ceiling'] if use_ceiling else []):
            _merge(merged, n, results[n], load)
        if use_torch:
            torch_times += [t['torch'] for t in turns]
            torch_rss = max(torch_rss, results['torch']['rss_mib'])
        for t in turns:
            rounds.append({k: images[k] / v for k, v in t.items()})
    rows = [dict(summarize(n, args.batch, merged[n]), load=merged[n]['load'])
            for n in counts]
    torch_row = ((statistics.median(torch_times), threads, torch_rss)
                 if use_torch else None)
    ceiling = (summarize(max(counts), args.batch, merged['ceiling'])
               if use_ceiling else None)
    overlapped = [dict(summarize(max(counts), args.batch, merged[name]),
                       name=name, buckets=merged[name]['buckets'],
                       load=merged[name]['load']) for name in ovl]
    return rows, torch_row, rounds, ceiling, overlapped


def _merge(merged, n, res, load):
    """Append one run's per-rank timings to those of earlier runs."""
    if n not in merged:
        merged[n] = dict(res, load=load)
        return
    for mine, new in zip(merged[n]['ranks'], res['ranks']):
        for key in ('step', 'cpu', 'wait', 'mean'):
            mine[key] = mine[key] + new[key]
        mine['rss_mib'] = max(mine['rss_mib'], new['rss_mib'])
    merged[n]['load'] = max(merged[n]['load'], load)


def report_rounds(counts, rounds):
    """Each round's efficiency (and ratio to PyTorch, and the ceiling with
    what the averaging costs below it), and their medians."""
    base, last = counts[0], counts[-1]

    def line(values, fmt):
        return '{} (median {}, {}-{})'.format(
            ', '.join(fmt.format(v) for v in values),
            fmt.format(statistics.median(values)), fmt.format(min(values)),
            fmt.format(max(values)))

    eff = [100 * t[last] / (last / base * t[base]) for t in rounds]
    print('efficiency at {} ranks, round by round: {}'.format(
        last, line(eff, '{:.1f}%')))
    if all('ceiling' in t for t in rounds):
        top = [100 * t['ceiling'] / (last / base * t[base]) for t in rounds]
        print('ceiling ({} ranks, no averaging), round by round: {}'.format(
            last, line(top, '{:.1f}%')))
        print('what the averaging costs, round by round: {}'.format(
            line([c - e for c, e in zip(top, eff)], '{:.1f} pt')))
    if all('torch' in t for t in rounds):
        ratio = [t[last] / t['torch'] for t in rounds]
        print('ratio minichain ({} ranks) / PyTorch, round by round: {}'
              .format(last, line(ratio, '{:.2f}x')))
    for name in sorted(k for k in rounds[0] if '+' in str(k)):
        eff = [100 * t[name] / (last / base * t[base]) for t in rounds]
        print('efficiency at {}, round by round: {}'.format(
            name, line(eff, '{:.1f}%')))
        print('overlapped / not ({} / {}), round by round: {}'.format(
            name, last, line([t[name] / t[last] for t in rounds],
                             '{:.3f}x')))


def report_overlap(rows, overlapped):
    """The exposed (not hidden) gradient communication per step, without
    overlap and with each overlapped job."""
    base, last = rows[0], rows[-1]
    print('exposed communication per step at {} ranks, not overlapped: '
          '{:.1f} ms ({:.1f} ms averaging + {:.1f} ms waiting for the slower '
          'rank)'.format(last['n'], 1e3 * (last['mean'] + last['wait']),
                         1e3 * last['mean'], 1e3 * last['wait']))
    for r in overlapped:
        exposed = r['mean'] + r['wait']
        print('exposed communication per step, {}: {:.1f} ms ({:.1f} ms in '
              'the hooks during backward, packing and posting {} buckets, '
              '+ {:.1f} ms after backward, waiting for the last ones and '
              'unpacking); {:.2f}x the not overlapped; efficiency {:.1f}%'
              .format(r['name'], 1e3 * exposed, 1e3 * r['mean'],
                      r['buckets'], 1e3 * r['wait'], exposed / max(
                          1e-12, last['mean'] + last['wait']),
                      100 * r['img_s'] / (r['n'] / base['n']
                                          * base['img_s'])))


def report(args, rows, torch_row, ceiling=None):
    """Print the table and the summary lines."""
    print('{:>5} {:>8} {:>7} {:>6} {:>7} {:>7} {:>6} {:>7} {:>8} {:>6} {:>5}'
          .format('ranks', 's/step', 'img/s', 'eff', 'comm', 'allred',
                  'wait', 'GB/s', 'RSS MiB', 'cpu s', 'load'))
    base = rows[0]
    for r in rows:
        r['eff'] = r['img_s'] / (r['n'] / base['n'] * base['img_s'])
        r['eff_cpu'] = base['cpu'] / r['cpu']
        print('{:>5} {:>8.3f} {:>7.2f} {:>5.1f}% {:>6.1f}% {:>6.1f}% '
              '{:>5.1f}% {:>7.2f} {:>8.0f} {:>6.3f} {:>5.2f}'.format(
                  r['n'], r['step'], r['img_s'], 100 * r['eff'],
                  100 * (r['mean'] + r['wait']) / r['step'],
                  100 * r['mean'] / r['step'], 100 * r['wait'] / r['step'],
                  r['bus_GBps'], r['rss_mib'], r['cpu'], r['load']))
    last = rows[-1]
    print('weak-scaling efficiency at {} ranks: {:.1f}% (throughput({}) / '
          '({} x throughput({})))'.format(last['n'], 100 * last['eff'],
                                          last['n'], last['n'] // base['n'],
                                          base['n']))
    print('by CPU time per step (as if each rank had a core to itself): '
          '{:.1f}%'.format(100 * last['eff_cpu']))
    if ceiling is not None:
        top = ceiling['img_s'] / (ceiling['n'] / base['n'] * base['img_s'])
        print('ceiling: {:.1f}% for the same {} ranks without the gradient '
              'averaging ({:.3f} s/step): what {} busy cores allow here; the '
              'averaging costs {:.1f} points'.format(
                  100 * top, ceiling['n'], ceiling['step'], ceiling['n'],
                  100 * (top - last['eff'])))
    print('gradient communication: {:.1f}% of a step at {} ranks ({:.3f} s '
          'allreduce of {:,} B + {:.3f} s waiting for the slower rank)'
          .format(100 * (last['mean'] + last['wait']) / last['step'],
                  last['n'], last['mean'], last['grad_bytes'], last['wait']))
    if torch_row is not None:
        step, threads, rss = torch_row
        gbatch = last['n'] * args.batch
        print('PyTorch, {} threads in one process, batch {}: {:.3f} s/step, '
              '{:.2f} img/s, {:.0f} MiB'.format(threads, gbatch, step,
                                                gbatch / step, rss))
        print('ratio minichain ({} ranks) / PyTorch: {:.2f}x'.format(
            last['n'], last['img_s'] / (gbatch / step)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--ranks', default='1,2',
                   help='comma-separated rank counts; the first is the base')
    p.add_argument('--arch', default='resnet50')
    p.add_argument('--batch', type=int, default=8, help='images per rank')
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--stem', default='imagenet')
    p.add_argument('--steps', type=int, default=5,
                   help='timed rounds (one step of each configuration)')
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--repeat', type=int, default=1,
                   help='start the workers K times, pooling their rounds')
    p.add_argument('--gap', type=float, default=0.3,
                   help='seconds of pause before each step')
    p.add_argument('--communicator', default='flat')
    p.add_argument('--overlap', action='store_true',
                   help='also run the largest rank count with overlapped '
                   'averaging, next to the plain one')
    p.add_argument('--progress', default='nodes',
                   help='with --overlap: comma-separated ways to progress '
                   'the buckets: nodes (a test after every backward '
                   'function: minichain\'s), poll (tests in the hooks '
                   'only), async (MPICH\'s progress thread too)')
    p.add_argument('--bucket-mb', type=float,
                   help='with --overlap: bucket size in MiB (default 25)')
    p.add_argument('--torch-threads', type=int,
                   help='default: the largest rank count')
    p.add_argument('--no-torch', action='store_true')
    p.add_argument('--no-ceiling', dest='ceiling', action='store_false',
                   help='skip the ranks without gradient averaging')
    p.add_argument('--timeout', type=float, default=900,
                   help='seconds to wait for any one answer of a worker')
    p.add_argument('--rank', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--rank-progress', help=argparse.SUPPRESS)
    p.add_argument('--no-comm', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--torch-worker', action='store_true',
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return run_rank(args)
    if args.torch_worker:
        return run_torch_worker(args)
    counts = [int(c) for c in args.ranks.split(',')]
    if args.overlap and args.warmup < 1:
        raise SystemExit('scaling.py: --overlap needs --warmup 1 or more (the '
                         'first averaging records the bucket order and is '
                         'not overlapped)')
    python = rank_python()
    print('{} {} px ({} stem), batch {} per rank, float32, MomentumSGD, '
          '{} communicator, 1 BLAS thread per rank; {} timed rounds after {} '
          'warm-up steps, {} run(s)'.format(args.arch, args.size, args.stem,
                                       args.batch, args.communicator,
                                       args.steps, args.warmup, args.repeat))
    print('ranks run {} under {}'.format(python, ' '.join(
        mpiexec_for(1, python)[:-2])), flush=True)
    use_torch = not args.no_torch and have_torch()
    rows, torch_row, rounds, ceiling, overlapped = measure(
        args, counts, python, use_torch)
    report(args, rows, torch_row, ceiling)
    if overlapped:
        report_overlap(rows, overlapped)
    report_rounds(counts, rounds)
    if not use_torch and not args.no_torch:
        print('PyTorch is not importable by {}: no comparison (run with '
              '.venv-bench/bin/python, which make bench creates)'
              .format(sys.executable))


if __name__ == '__main__':
    main()
