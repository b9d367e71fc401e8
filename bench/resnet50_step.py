"""Time one ResNet-50 training step on the CPU: minichain next to PyTorch.

A step is forward + softmax cross-entropy + backward + MomentumSGD update in
float32. Each framework runs in its own worker process (so thread pools and
peak memory do not mix) at batch 8 / 224x224 (ImageNet stem), batch 32 /
32x32 (small-input stem) and batch 32 / 28x28 with the stride-2 small stem
(``small2``: the main job, ``make train``, whose maps are 14x14 into the
first stage and 2x2 at the last). The two workers warm up, then take turns,
one step each (``_interleave.py`` says why): every minichain step has a
PyTorch step seconds away, and the speed ratio is the median over those
pairs. The script prints the median step time, images per second, achieved
GFLOP/s, the fraction of the machine's peak, the peak resident memory, and
the ratios.

    python bench/resnet50_step.py [--steps 5] [--warmup 2] [--peak 232]
        [--repeat K] [--config 8x224:imagenet ...] [--threads N]

With ``--repeat K`` the pair of workers is started K times (each run's own
median ratio is listed next to the median over all pairs).

With ``--against DIR`` a third worker runs the minichain of another
checkout (``git worktree add /tmp/before <commit>``) in the same turns, and
a line gives this checkout's speed against it: how a change is measured
step for step when two runs minutes apart differ by more than the change.

With ``--never`` one more worker runs this checkout with
``MINICHAIN_ONEDNN=never`` (the NumPy path) in the same turns, and a line
gives the oneDNN kernels' speed against it.

With ``--bf16`` two more workers take the same turns: minichain with
``MINICHAIN_FP32_MATH=bf16`` (the convolutions' factors in bfloat16,
float32 sums: docs/precision.md) and PyTorch under ``torch.autocast('cpu',
dtype=torch.bfloat16)``; lines give minichain bf16 against PyTorch bf16
and against minichain float32. With ``--mixed16`` minichain under
``config.dtype = 'mixed16'`` (activations in bfloat16 between the layers,
as autocast keeps them; float32 parameters) takes them too, against
PyTorch bf16 and against minichain bf16 where that worker runs.

PyTorch is optional: without it the ratios are left out (``make bench``
installs the CPU build into the bench's own environment).
"""
import argparse
import os
import resource
import sys
import time

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _interleave  # noqa: E402
import _torch_models  # noqa: E402

ROOT = os.path.dirname(HERE)
CONFIGS = [(8, 224, 'imagenet'), (32, 32, 'small'), (32, 28, 'small2')]
CORES = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') \
    else (os.cpu_count() or 1)


def conv_macs(batch, size, stem, counts=(3, 4, 6, 3), n_classes=1000):
    """Multiply-accumulates of one ResNet-50 forward pass, counted layer by layer."""
    macs = 0

    def conv(h, cin, cout, k, s, p):
        nonlocal macs
        ho = (h + 2 * p - k) // s + 1
        macs += batch * cout * ho * ho * cin * k * k
        return ho

    h = conv(size, 3, 64, 7, 2, 3) if stem == 'imagenet' else \
        conv(size, 3, 64, 3, 2 if stem == 'small2' else 1, 1)
    if stem == 'imagenet':
        h = (h + 2 - 3) // 2 + 1
    cin = 64
    for i, (n, mid) in enumerate(zip(counts, (64, 128, 256, 512))):
        for j in range(n):
            s = 2 if (i > 0 and j == 0) else 1
            if s != 1 or cin != mid * 4:
                conv(h, cin, mid * 4, 1, s, 0)
            conv(h, cin, mid, 1, 1, 0)
            h2 = conv(h, mid, mid, 3, s, 1)
            conv(h2, mid, mid * 4, 1, 1, 0)
            h, cin = h2, mid * 4
    return macs + batch * cin * n_classes


def step_flops(batch, size, stem):
    """FLOPs of a training step: forward, and backward at twice the forward."""
    return 3 * 2 * conv_macs(batch, size, stem)


def minichain_step(batch, size, stem, root=ROOT, dtype='float32'):
    """A function running one minichain training step (minichain and its
    ResNet-50 from the checkout ``root``, ``config.dtype`` ``dtype``);
    returns its seconds."""
    sys.path.insert(0, root)
    import minichain
    minichain.config.dtype = dtype
    from minichain import host, optimizers
    from models.resnet import ResNet50, loss_and_accuracy
    where = os.path.dirname(os.path.dirname(os.path.abspath(
        minichain.__file__)))
    if os.path.realpath(where) != os.path.realpath(root):
        raise RuntimeError('resnet50_step: minichain came from {}, not from '
                           'the checkout {}'.format(where, root))
    host.tune_malloc()  # reuse freed activation buffers (minichain.host)
    model = ResNet50(1000, stem=stem)
    opt = optimizers.MomentumSGD(lr=0.01, momentum=0.9).setup(model)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size), dtype=numpy.float32)
    t = rng.integers(0, 1000, batch).astype(numpy.int32)

    def step():
        start = time.perf_counter()
        opt.update(loss_and_accuracy, model, x, t)
        return time.perf_counter() - start
    return step


def torch_step(batch, size, stem, threads, autocast=False):
    """A function running one PyTorch training step; returns its seconds."""
    return _torch_models.torch_step('resnet50', stem, batch, size, threads,
                                    autocast=autocast)


def worker(args):
    if args.worker == 'minichain':
        step = minichain_step(args.batch, args.size, args.stem,
                              args.root or ROOT, args.dtype)
    else:
        step = torch_step(args.batch, args.size, args.stem, args.threads,
                          args.autocast)
    _interleave.serve(step, args.warmup,
                      lambda: {'peak_rss_mib': resource.getrusage(
                          resource.RUSAGE_SELF).ru_maxrss / 1024.0})


def start(name, batch, size, stem, args):
    """A warmed-up worker process for framework ``name``."""
    cmd = [sys.executable, os.path.abspath(__file__), '--worker',
           'torch' if name == 'torch-bf16' else 'minichain' if name in (
               'before', 'never', 'bf16', 'mixed16') else name,
           '--batch', str(batch), '--size', str(size), '--stem', stem,
           '--warmup', str(args.warmup), '--threads', str(args.threads)]
    if name == 'before':
        cmd += ['--root', args.against]
    if name == 'torch-bf16':
        cmd += ['--autocast']
    if name == 'mixed16':
        cmd += ['--dtype', 'mixed16']
    # BLAS reads its thread count when NumPy loads it: set it beforehand.
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads),
               OMP_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    if name == 'never':
        env['MINICHAIN_ONEDNN'] = 'never'
    if name == 'bf16':
        env['MINICHAIN_FP32_MATH'] = 'bf16'
    # OpenMP threads (oneDNN's, PyTorch's) sleep while waiting, after a
    # short spin, as the training script has them (bench/README.md,
    # "oneDNN kernels"); the environment's settings win.
    env.setdefault('OMP_WAIT_POLICY', 'passive')
    env.setdefault('GOMP_SPINCOUNT', '10000')
    return _interleave.Worker(name, cmd, env=env, timeout=args.timeout)


def run_pair(names, batch, size, stem, args):
    """Start the workers one after the other, let them take turns for
    ``args.steps`` rounds; returns (rounds, {name: peak RSS MiB})."""
    workers = []
    try:
        for name in names:
            workers.append(start(name, batch, size, stem, args))
        rounds = _interleave.take_turns(workers, args.steps, args.gap)
        rss = {w.name: w.finish()['peak_rss_mib'] for w in workers}
    finally:
        for w in workers:
            w.close()
    return rounds, rss


def parse_config(text):
    """'8x224:imagenet' -> (8, 224, 'imagenet')."""
    try:
        shape, stem = text.split(':')
        batch, size = (int(v) for v in shape.split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(
            'resnet50_step: --config wants BATCHxSIZE:STEM, e.g. '
            '8x224:imagenet, got {!r}'.format(text)) from None
    if stem not in ('imagenet', 'small', 'small2') or batch < 1 or size < 8:
        raise argparse.ArgumentTypeError(
            'resnet50_step: bad --config {!r} (stem imagenet, small or '
            'small2; batch >= 1; size >= 8)'.format(text))
    return batch, size, stem


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--steps', type=int, default=5,
                   help='timed steps (rounds of turns) per run')
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--peak', type=float, default=232.0,
                   help="the machine's peak float32 GFLOP/s")
    p.add_argument('--only', choices=['minichain', 'torch'])
    p.add_argument('--repeat', type=int, default=1,
                   help='start the workers K times; print every run\'s '
                        'median ratio and the median over all pairs')
    p.add_argument('--config', type=parse_config, action='append',
                   help='BATCHxSIZE:STEM (repeatable; default 8x224:imagenet,'
                        ' 32x32:small and 32x28:small2)')
    p.add_argument('--threads', type=int, default=CORES,
                   help='threads of each framework: minichain\'s own '
                        '(set as its BLAS thread count), intra-op threads '
                        'for PyTorch (default: the cores this process may '
                        'use, %(default)s)')
    p.add_argument('--gap', type=float, default=0.3,
                   help='seconds of pause before each step')
    p.add_argument('--timeout', type=float, default=900,
                   help='seconds to wait for any one answer of a worker')
    p.add_argument('--against', metavar='DIR',
                   help='another checkout whose minichain takes turns too '
                        '(the "before" worker)')
    p.add_argument('--never', action='store_true',
                   help='a worker with MINICHAIN_ONEDNN=never takes turns '
                        'too (the NumPy path)')
    p.add_argument('--bf16', action='store_true',
                   help='minichain with bfloat16 compute and PyTorch under '
                        'bfloat16 autocast take turns too')
    p.add_argument('--mixed16', action='store_true',
                   help="minichain under config.dtype 'mixed16' (bfloat16 "
                        'activations) takes turns too, beside PyTorch under '
                        'bfloat16 autocast')
    p.add_argument('--dtype', default='float32', help=argparse.SUPPRESS)
    p.add_argument('--worker', choices=['minichain', 'torch'],
                   help=argparse.SUPPRESS)
    p.add_argument('--autocast', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--root', help=argparse.SUPPRESS)
    p.add_argument('--batch', type=int, help=argparse.SUPPRESS)
    p.add_argument('--size', type=int, help=argparse.SUPPRESS)
    p.add_argument('--stem', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    names = ['minichain'] + (['torch'] if _torch_models.have_torch() else [])
    if args.only:
        names = [args.only]
    if not args.only and 'torch' not in names:
        print('PyTorch is not importable here: no ratio (make bench installs '
              'it in .venv-bench)')
    if args.threads < 1:
        p.error('--threads must be at least 1')
    if args.against:
        if not os.path.isfile(os.path.join(args.against, 'minichain',
                                           '__init__.py')):
            p.error('--against {}: no minichain/__init__.py there (give a '
                    'checkout, e.g. git worktree add /tmp/before HEAD~1)'
                    .format(args.against))
        names.insert(1, 'before')
    if args.never:
        names.insert(1, 'never')
    if args.bf16:
        names += ['bf16'] + (['torch-bf16'] if 'torch' in names else [])
    if args.mixed16:
        names += ['mixed16'] + (['torch-bf16'] if 'torch' in names
                                and 'torch-bf16' not in names else [])
    print('{} thread(s) per framework; workers take turns, {} s apart'
          .format(args.threads, args.gap))
    print('{:<10} {:>5} {:>4} {:>9} {:>8} {:>8} {:>6} {:>9}'.format(
        'framework', 'batch', 'px', 's/step', 'img/s', 'GFLOP/s', 'peak',
        'RSS MiB'))
    for batch, size, stem in args.config or CONFIGS:
        runs = [run_pair(names, batch, size, stem, args)
                for _ in range(args.repeat)]
        report(names, batch, size, stem, runs, args.peak)
    sys.stdout.flush()


def report(names, batch, size, stem, runs, peak):
    """Print one config's rows and its ratio line; returns the pair ratios
    (PyTorch's step time / minichain's, one per round) or None."""
    for name in names:
        med = float(numpy.median([r[name] for rounds, _ in runs
                                  for r in rounds]))
        rss = max(mem[name] for _, mem in runs)
        gflops = step_flops(batch, size, stem) / med / 1e9
        print('{:<10} {:>5} {:>4} {:>9.3f} {:>8.2f} {:>8.1f} {:>5.0f}% '
              '{:>9.0f}'.format(name, batch, size, med, batch / med, gflops,
                                100 * gflops / peak, rss))
    pairs = None
    if 'minichain' in names and 'torch' in names:
        pairs = _ratio_line(runs, 'torch', 'PyTorch', batch, size)
    if 'minichain' in names and 'before' in names:
        _ratio_line(runs, 'before', 'before', batch, size)
    if 'minichain' in names and 'never' in names:
        _ratio_line(runs, 'never', 'never', batch, size)
    if 'bf16' in names and 'torch-bf16' in names:
        _ratio_line(runs, 'torch-bf16', 'PyTorch bf16', batch, size, 'bf16')
    if 'bf16' in names and 'minichain' in names:
        _ratio_line(runs, 'minichain', 'minichain float32', batch, size,
                    'bf16')
    if 'mixed16' in names and 'torch-bf16' in names:
        _ratio_line(runs, 'torch-bf16', 'PyTorch bf16', batch, size,
                    'mixed16')
    if 'mixed16' in names and 'bf16' in names:
        _ratio_line(runs, 'bf16', 'minichain bf16', batch, size, 'mixed16')
    return pairs


def _ratio_line(runs, other, label, batch, size, mine='minichain'):
    """Print worker ``mine``'s speed and peak memory against worker
    ``other`` (its step time / mine's, per round); returns the pair
    ratios."""
    per_run = [[r[other] / r[mine] for r in rounds]
               for rounds, _ in runs]
    pairs = [v for run in per_run for v in run]
    mem = (max(m[mine] for _, m in runs)
           / max(m[other] for _, m in runs))
    spread = '' if len(runs) < 2 else '; per run {}'.format(', '.join(
        '{:.2f}'.format(float(numpy.median(run))) for run in per_run))
    print('  ratio {}/{} at batch {} / {} px: speed {:.2f}x '
          '(median of {} step pairs, {:.2f}-{:.2f}{}), peak memory {:.2f}x'
          .format('minichain' if mine == 'minichain' else 'minichain ' + mine,
                  label, batch, size, float(numpy.median(pairs)), len(pairs),
                  min(pairs), max(pairs), spread, mem))
    return pairs


if __name__ == '__main__':
    main()
