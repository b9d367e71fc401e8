"""Where a ResNet-50 training step spends its time, op by op, on the CPU.

Every FunctionNode's forward is timed where ``FunctionNode.apply`` runs it,
at the kernel seam (its kernel, or its body where no kernel takes the
arrays; the outermost one only, so an op that calls another is not counted
twice). Backward work shows up under the
nodes that backward creates: ``Deconvolution2D`` is a convolution's input
gradient, ``Convolution2DGradW`` its weight gradient, ``*Grad`` the
gradients of batch normalization, ReLU and pooling. "other" is the rest of
the step: graph bookkeeping, the MomentumSGD update, Python.

With ``--copies N`` the same profile is then taken with N copies running at
once, each with one BLAS thread, as N ranks of ``bench/scaling.py`` run
(without the allreduce): the growth per op shows what the copies compete
for. With ``--lockstep`` the copies also start every step together (the
driver waits until all are ready), as ranks do after each allreduce, so
that they run the same phases at the same moment.

``--threads N`` profiles one process with N threads instead (as
``bench/resnet50_step.py`` runs it; no copies), and ``--torch`` adds
PyTorch's step at the same shape and thread count, by aten op (self time,
``torch.profiler``): ``mkldnn_convolution`` is its forward convolution,
``convolution_backward`` both of its gradients, ``add_`` mostly the
gradient accumulation and the SGD update.

    PYTHONPATH=. python bench/op_profile.py [--batch 8] [--size 224]
        [--stem imagenet] [--steps 4] [--copies 2] [--lockstep]
    PYTHONPATH=. python bench/op_profile.py --batch 32 --size 28 \
        --stem small2 --threads 2 --torch
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def instrument(seconds):
    """Wrap the kernel seam (``minichain.kernel_seam.forward``, which runs a
    node's kernel, or its body where no kernel takes the arrays) to add
    each node type's time."""
    from minichain import kernel_seam as kernels
    depth = threading.local()
    real = kernels.forward

    def timed(node, inputs):
        if getattr(depth, 'n', 0):
            return real(node, inputs)
        depth.n = 1
        start = time.perf_counter()
        try:
            return real(node, inputs)
        finally:
            seconds[type(node).__name__] += time.perf_counter() - start
            depth.n = 0
    kernels.forward = timed


def worker(args):
    """One profiled run; prints a JSON line {op: seconds per step}."""
    sys.path.insert(0, ROOT)
    seconds = collections.defaultdict(float)
    instrument(seconds)
    from minichain import host, optimizers
    host.tune_malloc()  # reuse freed activation buffers (minichain.host)
    from models.resnet import ResNet50, loss_and_accuracy
    model = ResNet50(1000, stem=args.stem)
    opt = optimizers.MomentumSGD(lr=0.01, momentum=0.9).setup(model)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((args.batch, 3, args.size, args.size),
                            dtype=numpy.float32)
    t = rng.integers(0, 1000, args.batch).astype(numpy.int32)
    opt.update(loss_and_accuracy, model, x, t)  # warm-up: page faults
    seconds.clear()
    total = 0.0
    for _ in range(args.steps):
        if args.lockstep:  # wait for the driver's word, as ranks wait in
            print('ready', flush=True)  # the allreduce before a step
            sys.stdin.readline()
        start = time.perf_counter()
        opt.update(loss_and_accuracy, model, x, t)
        total += time.perf_counter() - start
    total /= args.steps
    per_step = {k: v / args.steps for k, v in seconds.items()}
    per_step['other'] = total - sum(per_step.values())
    per_step['total'] = total
    print(json.dumps(per_step))


def _lockstep(procs, steps):
    """Before each step wait until every copy is ready, then let all go.
    A copy that stops answering (it failed) ends the protocol; its exit
    status tells the rest."""
    for _ in range(steps):
        if any(p.stdout.readline().strip() != 'ready' for p in procs):
            return
        try:
            for p in procs:
                p.stdin.write('go\n')
                p.stdin.flush()
        except BrokenPipeError:
            return


def torch_worker(args):
    """PyTorch's step profiled by aten op; prints {op: seconds per step}."""
    sys.path.insert(0, os.path.join(ROOT, 'bench'))
    import _torch_models
    from torch.profiler import ProfilerActivity, profile
    step = _torch_models.torch_step('resnet50', args.stem, args.batch,
                                    args.size, args.threads)
    step()  # warm-up: oneDNN picks its kernels
    step()
    total = 0.0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            total += step()
    per_step = {}
    for e in prof.key_averages():
        if e.key.startswith('aten::'):
            per_step[e.key[6:]] = e.self_cpu_time_total / 1e6 / args.steps
    per_step['other'] = total / args.steps - sum(per_step.values())
    per_step['total'] = total / args.steps
    print(json.dumps(per_step))


def _env(threads):
    n = str(threads)
    return {'OPENBLAS_NUM_THREADS': n, 'OMP_NUM_THREADS': n,
            'MKL_NUM_THREADS': n, 'MINICHAIN_HOST_THREADS': n}


def run_copies(args, copies, framework='minichain'):
    """Start ``copies`` workers at once; return their profiles."""
    cmd = [sys.executable, os.path.abspath(__file__), '--worker', framework,
           '--batch', str(args.batch), '--size', str(args.size),
           '--stem', args.stem, '--threads', str(args.threads),
           '--steps', str(args.steps)]
    if args.lockstep:
        cmd.append('--lockstep')
    env = dict(os.environ, **_env(args.threads))
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(copies)]
    if args.lockstep:
        _lockstep(procs, args.steps)
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit('op_profile.py: a worker failed (exit {})'.format(
            [p.returncode for p in procs]))
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--stem', choices=['imagenet', 'small', 'small2'],
                   help='default: imagenet above 64 px, else small')
    p.add_argument('--threads', type=int, default=1,
                   help='threads of the process (more than 1: no copies)')
    p.add_argument('--torch', action='store_true',
                   help="also profile PyTorch's step by aten op")
    p.add_argument('--steps', type=int, default=4, help='timed steps')
    p.add_argument('--copies', type=int, default=2,
                   help='also profile this many copies at once (1: skip)')
    p.add_argument('--lockstep', action='store_true',
                   help='the copies start every step together, as MPI ranks '
                        'do after each allreduce (default: free-running)')
    p.add_argument('--worker', nargs='?', const='minichain',
                   choices=['minichain', 'torch'], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stem is None:
        args.stem = 'imagenet' if args.size > 64 else 'small'
    if args.worker == 'torch':
        return torch_worker(args)
    if args.worker:
        return worker(args)
    if args.threads < 1:
        p.error('--threads must be at least 1')
    alone = run_copies(args, 1)[0]
    cols = [('1 copy', alone)]
    if args.copies > 1 and args.threads == 1:
        many = run_copies(args, args.copies)
        mean = {k: sum(m.get(k, 0.0) for m in many) / len(many)
                for k in alone}
        cols.append(('{} copies'.format(args.copies), mean))
    print('ResNet-50, batch {}, {} px, {} stem, {} thread(s); seconds per '
          'step (mean of {} steps after a warm-up){}'.format(
              args.batch, args.size, args.stem, args.threads, args.steps,
              '; the copies in lockstep' if args.lockstep else ''))
    print('{:<28}'.format('op') + ''.join('{:>10}'.format(c) for c, _ in cols)
          + ('   growth' if len(cols) > 1 else ''))
    ops = [k for k in alone if k not in ('other', 'total')]
    small = [k for k in ops if alone[k] < 0.001]
    for _, col in cols:  # ops under a millisecond share one row
        col['ops under 1 ms ({})'.format(len(small))] = sum(
            col.get(k, 0.0) for k in small)
    order = sorted((k for k in ops if k not in small),
                   key=lambda k: -alone[k])
    order += [k for k in alone if k.startswith('ops under')]
    order += ['other', 'total']
    for k in order:
        row = '{:<28}'.format(k) + ''.join(
            '{:>10.3f}'.format(c[k]) for _, c in cols)
        if len(cols) > 1 and alone[k] > 0.005:
            row += '   {:+5.0f}%'.format(100 * (cols[1][1][k] / alone[k] - 1))
        print(row)
    if args.torch:
        print_torch(run_copies(args, 1, 'torch')[0])


def print_torch(prof, rows=12):
    """PyTorch's top aten ops by self time, then the rest."""
    print('PyTorch, the same step: seconds per step by aten op (self time)')
    ops = sorted((k for k in prof if k not in ('other', 'total')),
                 key=lambda k: -prof[k])
    for k in ops[:rows]:
        print('{:<28}{:>10.3f}'.format(k, prof[k]))
    print('{:<28}{:>10.3f}'.format('{} other aten ops'.format(
        len(ops[rows:])), sum(prof[k] for k in ops[rows:])))
    for k in ('other', 'total'):
        print('{:<28}{:>10.3f}'.format(k, prof[k]))


if __name__ == '__main__':
    main()
