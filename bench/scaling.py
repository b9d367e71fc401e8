"""Weak scaling of the ResNet training step over MPI ranks on this machine.

Runs the same data-parallel training step (forward, softmax cross-entropy,
backward, gradient averaging, MomentumSGD; float32) under ``mpiexec -n 1``
and ``mpiexec -n 2`` (it launches them itself), one BLAS thread per rank,
a fixed batch per rank, and prints:

- seconds per step (the slowest rank's, median over the timed steps) and
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
  ``--repeat K`` runs everything K times in turn and keeps the fastest,
  then prints each repeat's efficiency and ratio to PyTorch (figures from
  runs minutes apart) and their medians: the machine's speed drifts by
  10% or more between minutes, the fastest-of figures can pair a fast
  spell with a slow one, and the per-repeat figures show the spread.

    python bench/scaling.py [--ranks 1,2] [--arch resnet50] [--batch 8]
        [--size 224] [--stem imagenet] [--steps 5] [--warmup 1] [--repeat 1]

Run it with .venv-bench's Python (``make bench``) to get the PyTorch
column. The ranks need mpi4py: when this Python lacks it they run under
the project's .venv Python instead (its mpiexec too), with this source
tree on PYTHONPATH.
"""
import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ONE_THREAD = {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1',
              'MKL_NUM_THREADS': '1', 'MINICHAIN_HOST_THREADS': '1'}


# --- the ranks -----------------------------------------------------------
class _TimedComm:
    """Times each ``multi_node_mean_grad`` of ``comm``: a barrier first
    (time waiting for the slower rank), then the averaging itself."""

    def __init__(self, comm):
        self.comm, self.wait, self.mean = comm, [], []
        self._inner = comm.multi_node_mean_grad
        comm.multi_node_mean_grad = self  # an instance attribute wins

    def __call__(self, model, zero_fill=False):
        t0 = time.perf_counter()
        self.comm.mpi_comm.Barrier()
        t1 = time.perf_counter()
        self._inner(model, zero_fill)
        t2 = time.perf_counter()
        self.wait.append(t1 - t0)
        self.mean.append(t2 - t1)


def run_rank(args):
    """One rank: time ``args.warmup + args.steps`` data-parallel steps;
    rank 0 prints the JSON summary of every rank's timings."""
    sys.path.insert(0, ROOT)
    from minichain import dist, optimizers
    from models.resnet import ResNet, loss_and_accuracy
    comm = dist.create_communicator(args.communicator)
    model = ResNet(args.arch, 1000, args.stem)
    opt = dist.create_multi_node_optimizer(
        optimizers.MomentumSGD(lr=0.01, momentum=0.9), comm).setup(model)
    rng = numpy.random.default_rng(comm.rank)
    x = rng.standard_normal((args.batch, 3, args.size, args.size),
                            dtype=numpy.float32)
    t = rng.integers(0, 1000, args.batch).astype(numpy.int32)
    opt.update(loss_and_accuracy, model, x, t)  # broadcasts only
    timer = _TimedComm(comm)
    steps, cpu = [], []
    for _ in range(args.warmup + args.steps):
        comm.mpi_comm.Barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        opt.update(loss_and_accuracy, model, x, t)
        steps.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    n = args.warmup
    mine = {'step': steps[n:], 'cpu': cpu[n:], 'wait': timer.wait[n:],
            'mean': timer.mean[n:],
            'rss_mib': resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024.0}
    ranks = comm.mpi_comm.gather(mine, root=0)
    if comm.rank == 0:
        grad_bytes = sum(p.grad.nbytes for p in model.params())
        print('RESULT ' + json.dumps({'ranks': ranks,
                                      'grad_bytes': grad_bytes}))


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


def mpiexec_for(python):
    """The mpiexec next to ``python`` (a venv's mpich), else on PATH."""
    here = os.path.join(os.path.dirname(python), 'mpiexec')
    found = here if os.path.exists(here) else shutil.which('mpiexec')
    if found is None:
        raise SystemExit('scaling.py: no mpiexec next to {} nor on PATH'
                         .format(python))
    return found


def launch(n, args, python):
    """Run ``n`` ranks; returns the rank-0 summary dict."""
    env = dict(os.environ, **ONE_THREAD)
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT] + [p for p in [env.get('PYTHONPATH')] if p])
    cmd = [mpiexec_for(python), '-n', str(n), python, os.path.abspath(
        __file__), '--rank', '--arch', args.arch, '--batch', str(args.batch),
        '--size', str(args.size), '--stem', args.stem, '--steps',
        str(args.steps), '--warmup', str(args.warmup), '--communicator',
        args.communicator]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SystemExit('scaling.py: {} ranks did not finish within {} s'
                         .format(n, args.timeout))
    results = [ln for ln in out.splitlines() if ln.startswith('RESULT ')]
    if proc.returncode != 0 or not results:
        raise SystemExit('scaling.py: mpiexec -n {} failed (exit {}):\n{}'
                         .format(n, proc.returncode, out[-4000:]))
    return json.loads(results[-1][len('RESULT '):])


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
    bus = (res['grad_bytes'] * 2 * (n - 1) / n / mean) if n > 1 else 0.0
    return {'n': n, 'step': step, 'cpu': cpu, 'img_s': n * batch / step,
            'wait': wait, 'mean': mean, 'bus_GBps': bus / 1e9,
            'rss_mib': max(r['rss_mib'] for r in ranks),
            'grad_bytes': res['grad_bytes']}


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def torch_resnet(arch='resnet50', stem='imagenet', n_classes=1000):
    """The network of models/resnet.py in PyTorch (same layers and shapes)."""
    import torch
    from torch import nn
    sys.path.insert(0, ROOT)
    from models.resnet import ARCHS
    kind, counts = ARCHS[arch]
    expansion = 4 if kind == 'bottleneck' else 1

    def conv_bn(cin, cout, k, s=1, p=0):
        return [nn.Conv2d(cin, cout, k, s, p, bias=False),
                nn.BatchNorm2d(cout)]

    class Block(nn.Module):
        def __init__(self, cin, mid, s):
            super().__init__()
            out = mid * expansion
            if kind == 'bottleneck':
                body = (conv_bn(cin, mid, 1) + [nn.ReLU(inplace=True)]
                        + conv_bn(mid, mid, 3, s, 1) + [nn.ReLU(inplace=True)]
                        + conv_bn(mid, out, 1))
            else:
                body = (conv_bn(cin, mid, 3, s, 1) + [nn.ReLU(inplace=True)]
                        + conv_bn(mid, out, 3, 1, 1))
            self.body = nn.Sequential(*body)
            self.proj = (nn.Sequential(*conv_bn(cin, out, 1, s))
                         if s != 1 or cin != out else None)

        def forward(self, x):
            sc = x if self.proj is None else self.proj(x)
            return torch.relu(self.body(x) + sc)

    if stem == 'imagenet':
        layers = conv_bn(3, 64, 7, 2, 3) + [nn.ReLU(inplace=True),
                                            nn.MaxPool2d(3, 2, 1)]
    else:
        layers = conv_bn(3, 64, 3, 1 if stem == 'small' else 2, 1) + [
            nn.ReLU(inplace=True)]
    cin = 64
    for i, (n, mid) in enumerate(zip(counts, (64, 128, 256, 512))):
        for j in range(n):
            layers.append(Block(cin, mid, 2 if (i > 0 and j == 0) else 1))
            cin = mid * expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, n_classes)]
    return nn.Sequential(*layers)


def time_torch(arch, stem, batch, size, steps, warmup, threads, device='cpu'):
    """Median seconds per PyTorch step (forward, loss, backward, SGD)."""
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = torch_resnet(arch, stem).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size, device=device)
    t = torch.randint(0, 1000, (batch,), device=device)
    lossf = torch.nn.CrossEntropyLoss()
    times = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad()
        lossf(model(x), t).backward()
        opt.step()
        if device != 'cpu':
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:])


def measure(args, counts, python, use_torch):
    """Best-of-``args.repeat`` figures per rank count, PyTorch's best s/step
    (or None), and each repeat's own figures; the repeats take turns so that
    load from other jobs hits every configuration alike."""
    best, torch_best, history = {}, None, []
    threads = args.torch_threads or max(counts)
    for _ in range(args.repeat):
        turn = {}
        for n in counts:
            load = os.getloadavg()[0]
            r = summarize(n, args.batch, launch(n, args, python))
            r['load'] = load
            turn[n] = r['img_s']
            if n not in best or r['step'] < best[n]['step']:
                best[n] = r
        if use_torch:
            load = os.getloadavg()[0]
            step = time_torch(args.arch, args.stem, max(counts) * args.batch,
                              args.size, args.steps, args.warmup, threads)
            turn['torch'] = max(counts) * args.batch / step
            if torch_best is None or step < torch_best[0]:
                torch_best = (step, threads, load)
        history.append(turn)
    return [best[n] for n in counts], torch_best, history


def report_repeats(counts, history):
    """Each repeat's efficiency (and ratio to PyTorch), and their medians."""
    base, last = counts[0], counts[-1]
    eff = [t[last] / (last / base * t[base]) for t in history]
    print('efficiency at {} ranks, repeat by repeat: {} (median {:.1f}%)'
          .format(last, ', '.join('{:.1f}%'.format(100 * e) for e in eff),
                  100 * statistics.median(eff)))
    if all('torch' in t for t in history):
        ratio = [t[last] / t['torch'] for t in history]
        print('ratio minichain ({} ranks) / PyTorch, repeat by repeat: {} '
              '(median {:.2f}x)'.format(
                  last, ', '.join('{:.2f}x'.format(v) for v in ratio),
                  statistics.median(ratio)))


def report(args, rows, torch_best):
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
    print('gradient communication: {:.1f}% of a step at {} ranks ({:.3f} s '
          'allreduce of {:,} B + {:.3f} s waiting for the slower rank)'
          .format(100 * (last['mean'] + last['wait']) / last['step'],
                  last['n'], last['mean'], last['grad_bytes'], last['wait']))
    if torch_best is not None:
        step, threads, load = torch_best
        gbatch = last['n'] * args.batch
        print('PyTorch, {} threads in one process, batch {}: {:.3f} s/step, '
              '{:.2f} img/s (load {:.2f})'.format(threads, gbatch, step,
                                                  gbatch / step, load))
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
    p.add_argument('--steps', type=int, default=5, help='timed steps')
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--repeat', type=int, default=1,
                   help='run everything K times in turn, keep the fastest')
    p.add_argument('--communicator', default='flat')
    p.add_argument('--torch-threads', type=int,
                   help='default: the largest rank count')
    p.add_argument('--no-torch', action='store_true')
    p.add_argument('--timeout', type=float, default=1800,
                   help='seconds for each mpiexec run')
    p.add_argument('--rank', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return run_rank(args)
    counts = [int(c) for c in args.ranks.split(',')]
    python = rank_python()
    print('{} {} px ({} stem), batch {} per rank, float32, MomentumSGD, '
          '{} communicator, 1 BLAS thread per rank; {} timed steps after {} '
          'warm-up, best of {}'.format(args.arch, args.size, args.stem,
                                       args.batch, args.communicator,
                                       args.steps, args.warmup, args.repeat))
    print('ranks run {} and {}'.format(python, mpiexec_for(python)),
          flush=True)
    use_torch = not args.no_torch and have_torch()
    rows, torch_best, history = measure(args, counts, python, use_torch)
    report(args, rows, torch_best)
    if args.repeat > 1:
        report_repeats(counts, history)
    if not use_torch and not args.no_torch:
        print('PyTorch is not importable by {}: no comparison (run with '
              '.venv-bench/bin/python, which make bench creates)'
              .format(sys.executable))

if __name__ == '__main__':
    main()
