"""A few iterations of models/train_resnet50.py, a snapshot, an exact resume.

Run A trains ``2 * K`` iterations (a snapshot after each epoch of ``K``);
run B resumes from A's first snapshot and trains to the same end. The
parameters and optimizer state of both final snapshots must be equal bit
for bit (every kernel minichain runs is deterministic: no atomics). Used
by bench/gpu_check.sh; ``--device cpu`` is a dry run without a GPU.

    python bench/gpu_resume.py [--device gpu] [--arch resnet50]
        [--batch 8] [--size 32] [--out DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = ['-m', 'models.train_resnet50']  # run from ROOT


def train(args, out, *extra):
    cmd = [sys.executable] + SCRIPT + [
        '--device', args.device, '--data', 'synthetic', '--arch', args.arch,
        '--batchsize', str(args.batch), '--image-size', str(args.size),
        '--train-subset', str(args.batch * args.per_epoch), '--val-subset',
        str(args.batch), '--iteration', str(2 * args.per_epoch), '--seed',
        '1', '--out', os.path.abspath(out)] + list(extra)
    start = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                         timeout=args.timeout)
    took = time.monotonic() - start
    if res.returncode != 0:
        sys.exit('gpu_resume: {} failed (exit {}):\n{}{}'.format(
            ' '.join(cmd), res.returncode, res.stdout[-3000:],
            res.stderr[-3000:]))
    return took


def state(path):
    with numpy.load(path) as npz:
        return {k: npz[k] for k in npz.files if k.startswith('updater/')}


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--device', choices=('gpu', 'cpu'), default='gpu')
    p.add_argument('--arch', default='resnet50')
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--size', type=int, default=32)
    p.add_argument('--per-epoch', type=int, default=3,
                   help='iterations per epoch (snapshot after each)')
    p.add_argument('--timeout', type=float, default=300)
    p.add_argument('--out', help='keep the runs here (default: a temporary '
                   'folder)')
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix='gpu_resume_') as tmp:
        out = args.out or tmp
        a, b = os.path.join(out, 'a'), os.path.join(out, 'b')
        first = os.path.join(a, 'snapshot_iter_{}'.format(args.per_epoch))
        last = 'snapshot_iter_{}'.format(2 * args.per_epoch)
        t_a = train(args, a)
        t_b = train(args, b, '--resume', first)
        want, got = state(os.path.join(a, last)), state(os.path.join(b, last))
        if sorted(want) != sorted(got) or not want:
            sys.exit('gpu_resume: the snapshots hold different entries')
        differ = [k for k in want if not numpy.array_equal(want[k], got[k])]
        print('gpu_resume: {} on {}: {} iterations in {:.1f} s, resumed '
              'from iteration {} in {:.1f} s; {} arrays compared, {} '
              'differ'.format(args.arch, args.device, 2 * args.per_epoch,
                              t_a, args.per_epoch, t_b, len(want),
                              len(differ)))
        if differ:
            sys.exit('gpu_resume: the resumed run differs: {}'.format(
                ', '.join(differ[:10])))
        print('RESUME-OK', flush=True)


if __name__ == '__main__':
    main()
