"""Time one ResNet-50 training step on the CPU: minichain next to PyTorch.

A step is forward + softmax cross-entropy + backward + MomentumSGD update in
float32. Each framework runs in its own subprocess (so thread pools and peak
memory do not mix) at batch 8 / 224x224 (ImageNet stem) and batch 32 / 32x32
(small-input stem); the script prints the median step time over several steps
after a warm-up, images per second, achieved GFLOP/s, the fraction of the
machine's peak, the peak resident memory, and minichain / PyTorch ratios.

    python bench/resnet50_step.py [--steps 5] [--warmup 2] [--peak 232]
        [--repeat K]

With ``--repeat K`` each framework runs K times, in turns, and the table
shows the median over the runs (the ratio is the median of the runs'
ratios, each run's listed): this machine's speed drifts by 10% or more
between minutes, which a single pair of runs cannot tell from a real gap.

PyTorch is optional: without it the ratios are left out (``make bench``
installs the CPU build into the bench's own environment).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CONFIGS = [(8, 224, 'imagenet'), (32, 32, 'small')]


def conv_macs(batch, size, stem, counts=(3, 4, 6, 3), n_classes=1000):
    """Multiply-accumulates of one ResNet-50 forward pass, counted layer by layer."""
    macs = 0

    def conv(h, cin, cout, k, s, p):
        nonlocal macs
        ho = (h + 2 * p - k) // s + 1
        macs += batch * cout * ho * ho * cin * k * k
        return ho

    h = conv(size, 3, 64, 7, 2, 3) if stem == 'imagenet' else \
        conv(size, 3, 64, 3, 1, 1)
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


def run_minichain(batch, size, stem, steps, warmup):
    sys.path.insert(0, ROOT)
    from minichain import optimizers
    from models.resnet import ResNet50, loss_and_accuracy
    model = ResNet50(1000, stem=stem)
    opt = optimizers.MomentumSGD(lr=0.01, momentum=0.9).setup(model)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size), dtype=numpy.float32)
    t = rng.integers(0, 1000, batch).astype(numpy.int32)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.update(loss_and_accuracy, model, x, t)
        times.append(time.perf_counter() - start)
    return times[warmup:]


def run_torch(batch, size, stem, steps, warmup):
    import torch
    from torch import nn
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, cin, mid, s):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, mid, 3, s, 1, bias=False), nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, mid * 4, 1, bias=False), nn.BatchNorm2d(mid * 4))
            self.proj = None
            if s != 1 or cin != mid * 4:
                self.proj = nn.Sequential(
                    nn.Conv2d(cin, mid * 4, 1, s, bias=False),
                    nn.BatchNorm2d(mid * 4))

        def forward(self, x):
            sc = x if self.proj is None else self.proj(x)
            return torch.relu(self.body(x) + sc)

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False) if stem == 'imagenet'
              else nn.Conv2d(3, 64, 3, 1, 1, bias=False),
              nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
    if stem == 'imagenet':
        layers.append(nn.MaxPool2d(3, 2, 1))
    cin = 64
    for i, (n, mid) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for j in range(n):
            layers.append(Block(cin, mid, 2 if (i > 0 and j == 0) else 1))
            cin = mid * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, size, size)
    t = torch.randint(0, 1000, (batch,))
    lossf = nn.CrossEntropyLoss()
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad()
        loss = lossf(model(x), t)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times[warmup:]


def worker(args):
    run = run_minichain if args.worker == 'minichain' else run_torch
    times = run(args.batch, args.size, args.stem, args.steps, args.warmup)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({'times': times, 'peak_rss_mib': peak_mib}))


def spawn(name, batch, size, stem, args):
    cmd = [sys.executable, os.path.abspath(__file__), '--worker', name,
           '--batch', str(batch), '--size', str(size), '--stem', stem,
           '--steps', str(args.steps), '--warmup', str(args.warmup)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        print('{} failed:\n{}'.format(name, out.stderr[-3000:]))
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--steps', type=int, default=5)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--peak', type=float, default=232.0,
                   help="the machine's peak float32 GFLOP/s")
    p.add_argument('--only', choices=['minichain', 'torch'])
    p.add_argument('--repeat', type=int, default=1,
                   help='run each framework K times, taking turns; print '
                        'medians and each run\'s speed ratio')
    p.add_argument('--worker', choices=['minichain', 'torch'],
                   help=argparse.SUPPRESS)
    p.add_argument('--batch', type=int, help=argparse.SUPPRESS)
    p.add_argument('--size', type=int, help=argparse.SUPPRESS)
    p.add_argument('--stem', help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    names = ['minichain'] + (['torch'] if have_torch() else [])
    if args.only:
        names = [args.only]
    if not args.only and 'torch' not in names:
        print('PyTorch is not importable here: no ratio (make bench installs '
              'it in .venv-bench)')
    print('{:<10} {:>5} {:>4} {:>9} {:>8} {:>8} {:>6} {:>9}'.format(
        'framework', 'batch', 'px', 's/step', 'img/s', 'GFLOP/s', 'peak',
        'RSS MiB'))
    for batch, size, stem in CONFIGS:
        runs = {name: [] for name in names}
        # The repeats take turns (minichain, PyTorch, minichain, ...) so that
        # a slow spell of this shared machine hits both frameworks alike.
        for _ in range(args.repeat):
            for name in names:
                r = spawn(name, batch, size, stem, args)
                # a failed run keeps its place (None), so that run i of one
                # framework is still paired with run i of the other
                runs[name].append(None if r is None else (
                    float(numpy.median(r['times'])), r['peak_rss_mib']))
        for name in names:
            done = [run for run in runs[name] if run is not None]
            if not done:
                continue
            med = float(numpy.median([t for t, _ in done]))
            rss = max(m for _, m in done)
            gflops = step_flops(batch, size, stem) / med / 1e9
            print('{:<10} {:>5} {:>4} {:>9.3f} {:>8.2f} {:>8.1f} {:>5.0f}% '
                  '{:>9.0f}'.format(name, batch, size, med, batch / med,
                                    gflops, 100 * gflops / args.peak, rss))
        pairs = [(m, t) for m, t in zip(runs.get('minichain', []),
                                        runs.get('torch', []))
                 if m is not None and t is not None]
        if pairs:
            speed = [tt / tm for (tm, _), (tt, _) in pairs]
            mem = max(mm for (_, mm), _ in pairs) / max(
                mt for _, (_, mt) in pairs)
            spread = '' if len(speed) < 2 else ' (runs: {})'.format(
                ', '.join('{:.2f}'.format(v) for v in speed))
            print('  ratio minichain/PyTorch at batch {} / {} px: speed '
                  '{:.2f}x{}, peak memory {:.2f}x'.format(
                      batch, size, float(numpy.median(speed)), spread, mem))
    sys.stdout.flush()


if __name__ == '__main__':
    main()
