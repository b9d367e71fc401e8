"""Time one ResNet training step on one GPU: minichain (CuPy) next to PyTorch.

A step is forward + softmax cross-entropy + backward + MomentumSGD update
at 224x224 (ImageNet stem), batch 64 by default (``--batch 64 32`` runs
each in turn), in float32 and, with ``--dtype float32 float16``, in
float16 too (the whole model and its data in half precision, on both
sides: no autocast, no master weights). minichain runs twice
(``--kernels cupy cudnn``): on its CuPy kernels (``config.use_cudnn``
'never') and with cuDNN behind the kernel seam ('always'), when cuDNN can
be used (else the line says why and the JSON holds ``cudnn_missing``).
Each step is followed by a device synchronisation, outside the framework,
so that the clock sees the GPU's work. PyTorch runs with cudnn.benchmark
on. TF32 is off on both sides
(``minichain.backend.set_tf32(False)``; PyTorch's matmul and cuDNN
``allow_tf32`` False), so both compute in float32; ``--tf32`` turns it on
on both sides, and every result line says which. Prints seconds per
step (median), images per second, peak memory (minichain: the most the
CuPy pool held after any step, which is what it reserved; PyTorch: peak
allocated and peak reserved), minichain's kernel launches in one more
step (CUPTI, bench/_launches.py), and the ratio minichain / PyTorch; one line
``GPU_STEP {json}`` per batch is for scripts (bench/gpu_check.sh).

    python bench/gpu_step.py [--batch 64 [32 ...]] [--size 224] [--steps 5]
        [--warmup 2] [--arch resnet50] [--device gpu|cpu] [--no-torch]
        [--tf32] [--dtype float32 [float16]] [--kernels cupy [cudnn]]

``--device cpu`` runs the same code on NumPy and PyTorch's CPU build: a
dry run of this script on a machine without a GPU.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

import _launches  # noqa: E402
import minichain  # noqa: E402
from minichain import backend, host, optimizers  # noqa: E402
from models.resnet import ResNet, loss_and_accuracy  # noqa: E402


def _to_dtype(model, dtype):
    """Every parameter and persistent array of ``model`` in ``dtype``."""
    for p in model.params():
        p.array = p.array.astype(dtype)
    for link in model.links():
        for name in link._persistent:
            value = getattr(link, name)
            if backend.is_array(value):
                setattr(link, name, value.astype(dtype))


def time_minichain(args, batch, dtype, kernels):
    """(median s/step, peak MiB held by CuPy's pool, 0 on the CPU, kernel
    launches in one more step or why not counted), on the CuPy kernels
    (``kernels`` 'cupy') or with cuDNN ('cudnn')."""
    with minichain.using_config('use_cudnn', 'always' if kernels == 'cudnn'
                                else 'never'):
        return _time_minichain(args, batch, dtype)


def _time_minichain(args, batch, dtype):
    model = ResNet(args.arch, 1000, args.stem)
    _to_dtype(model, dtype)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((batch, 3, args.size, args.size)).astype(dtype)
    t = rng.integers(0, 1000, batch).astype(numpy.int32)
    sync = lambda: None  # noqa: E731
    pool = None
    if args.device == 'gpu':
        cupy = backend.get_cupy()
        pool = cupy.get_default_memory_pool()
        pool.free_all_blocks()
        model.to_gpu(0)
        x, t = backend.to_gpu(x, 0), backend.to_gpu(t, 0)
        sync = cupy.cuda.Device(0).synchronize
    opt = optimizers.MomentumSGD(lr=0.01, momentum=0.9).setup(model)
    times, held = [], 0.0
    for _ in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.update(loss_and_accuracy, model, x, t)
        sync()
        times.append(time.perf_counter() - start)
        if pool is not None:
            held = max(held, pool.total_bytes() / 2 ** 20)
    launches = 'not on the CPU' if pool is None else _launches.problem()
    if not launches:
        with _launches.Launches() as counter:
            opt.update(loss_and_accuracy, model, x, t)
        launches = counter.count
    del model, opt, x, t
    if pool is not None:
        pool.free_all_blocks()
    return statistics.median(times[args.warmup:]), held, launches


def time_pytorch(args, batch, dtype):
    """(median s/step, peak MiB allocated, peak MiB reserved; 0 on the
    CPU)."""
    import torch
    from _torch_models import time_torch
    device = 'cpu'
    if args.device == 'gpu':
        device = 'cuda:0'
        torch.cuda.init()
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step = time_torch(args.arch, args.stem, batch, args.size,
                      args.steps, args.warmup, os.cpu_count() or 1, device,
                      dtype)
    if args.device != 'gpu':
        return step, 0.0, 0.0
    return (step, torch.cuda.max_memory_allocated() / 2 ** 20,
            torch.cuda.max_memory_reserved() / 2 ** 20)


def torch_missing(args):
    """Why PyTorch is left out, or '' when it runs."""
    if args.no_torch:
        return '--no-torch'
    try:
        import torch
    except ImportError:
        return 'not importable'
    if args.device == 'gpu' and not torch.cuda.is_available():
        return 'its build sees no CUDA device'
    return ''


def device_name(args):
    if args.device == 'cpu':
        return 'CPU'
    cupy = backend.get_cupy()
    name = cupy.cuda.runtime.getDeviceProperties(0)['name']
    return name.decode() if isinstance(name, bytes) else str(name)


def cudnn_missing(args):
    """Why minichain's cuDNN kernels cannot run here, or ''."""
    from minichain.kernels import cudnn
    return cudnn.problem()


def run(args, batch, dtype):
    tf32 = 'on' if args.tf32 else 'off'
    name = device_name(args)
    where = '{} {} px, batch {}, {}{} on {}'.format(
        args.arch, args.size, batch, dtype, ' (TF32 {})'.format(tf32)
        if dtype == 'float32' else '', name)
    result = {'device': name, 'batch': batch, 'size': args.size,
              'arch': args.arch, 'tf32': tf32, 'dtype': dtype}
    best = None
    for kernels in args.kernels:
        why = cudnn_missing(args) if kernels == 'cudnn' else ''
        if why:
            result['cudnn_missing'] = why
            print('minichain  cuDNN: not run ({})'.format(why), flush=True)
            continue
        step, held, launches = time_minichain(args, batch, dtype, kernels)
        key = 'minichain' if kernels == 'cupy' else 'cudnn'
        result.update({key + '_s': step, key + '_img_s': batch / step,
                       key + '_peak_mib': held, key + '_launches': launches})
        best = step if best is None else min(best, step)
        print('minichain  {:5s} {}: {:.4f} s/step, {:.1f} img/s{}, kernel '
              'launches/step: {}'.format(
                  kernels, where, step, batch / step, ', peak {:.0f} MiB '
                  'held by the CuPy pool'.format(held)
                  if args.device == 'gpu' else '', launches), flush=True)
    why = torch_missing(args)
    if why:
        print('PyTorch: not compared ({})'.format(why))
    else:
        tstep, alloc, reserved = time_pytorch(args, batch, dtype)
        result.update(torch_s=tstep, torch_img_s=batch / tstep,
                      torch_peak_alloc_mib=alloc,
                      torch_peak_reserved_mib=reserved)
        print('PyTorch          {}: {:.4f} s/step, {:.1f} img/s{}'.format(
            where, tstep, batch / tstep,
            ', peak {:.0f} MiB allocated, {:.0f} MiB reserved (cudnn.'
            'benchmark)'.format(alloc, reserved)
            if args.device == 'gpu' else ''))
        if best is not None:
            result['ratio'] = tstep / best
            print('ratio minichain (best) / PyTorch (images per second): '
                  '{:.2f}x'.format(tstep / best))
    print('GPU_STEP ' + json.dumps(result), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', default='resnet50')
    p.add_argument('--stem', default='imagenet')
    p.add_argument('--batch', type=int, nargs='+', default=[64])
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--steps', type=int, default=5)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--device', choices=('gpu', 'cpu'), default='gpu')
    p.add_argument('--no-torch', action='store_true')
    p.add_argument('--tf32', action='store_true',
                   help='float32 products on TF32 tensor cores, both sides')
    p.add_argument('--dtype', nargs='+', default=['float32'],
                   choices=('float32', 'float16'))
    p.add_argument('--kernels', nargs='+', default=['cupy', 'cudnn'],
                   choices=('cupy', 'cudnn'))
    args = p.parse_args()
    if args.device == 'gpu':
        backend.check_cuda_available()
        backend.set_tf32(args.tf32)
    for dtype in args.dtype:
        for batch in args.batch:
            run(args, batch, dtype)


if __name__ == '__main__':
    host.tune_malloc()  # reuse freed activation buffers (minichain.host)
    main()
