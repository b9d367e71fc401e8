"""When each of ResNet-50's gradients becomes final in a real backward.

Runs ResNet-50 (224 px, ImageNet stem, float32) forward and backward on
this machine's CPU (or a GPU with ``--device gpu``) and records, with the
tape's gradient-ready hooks (``Link.register_grad_hook``), the moment each
parameter's gradient is final, counted from the start of backward. The
median over ``--repeat`` backward passes (after one warm-up) is written as
JSON: the forward and backward seconds and, in the order the gradients
became final, each one's time and float32 bytes. ``bench/scaling_model.py``
reads that file (``bench/resnet50_ready.json`` by default) to compute its
"+ overlap" columns: where each bucket of gradients is ready along
backward, as a fraction of it.

    python bench/ready_times.py [--batch 8] [--repeat 3] [--out FILE]

Only the fractions matter to the model (it scales them to the step time
it assumes), so a CPU's profile stands in for a GPU's, roughly: layers
near the input cost more of backward on both.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
DEFAULT_OUT = os.path.join(HERE, 'resnet50_ready.json')


def measure(arch='resnet50', batch=8, size=224, stem='imagenet', repeat=3,
            device='cpu'):
    """The profile as a dict (see the module docstring)."""
    import numpy
    from minichain import backend, functions as F
    from models.resnet import ResNet
    model = ResNet(arch, 1000, stem)
    dev = -1
    if device == 'gpu':
        dev = 0
        model.to_device(dev)
    xp = backend.get_cupy() if dev >= 0 else numpy
    rng = numpy.random.default_rng(0)
    x = xp.asarray(rng.standard_normal((batch, 3, size, size),
                                       dtype=numpy.float32))
    t = xp.asarray(rng.integers(0, 1000, batch).astype(numpy.int32))
    names = {id(p): n for n, p in model.namedparams()}
    marks = []

    def sync():
        if dev >= 0:
            backend.get_cupy().cuda.Device(dev).synchronize()

    def ready(param):
        sync()
        marks.append((time.perf_counter(), names[id(param)],
                      param.size * 4))
    handle = model.register_grad_hook(ready)
    runs = []
    try:
        for _ in range(repeat + 1):
            model.cleargrads()
            del marks[:]
            t0 = time.perf_counter()
            loss = F.softmax_cross_entropy(model(x), t)
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            runs.append((t1 - t0, t2 - t1, [(m - t1, n, b)
                                             for m, n, b in marks]))
    finally:
        handle.remove()
    runs = runs[1:]
    order = [n for _, n, _ in runs[0][2]]
    nbytes = {n: b for _, n, b in runs[0][2]}
    at = {n: statistics.median(dict((k, s) for s, k, _ in r[2])[n]
                               for r in runs) for n in order}
    return {'arch': arch, 'batch': batch, 'size': size, 'device': device,
            'forward_s': statistics.median(r[0] for r in runs),
            'backward_s': statistics.median(r[1] for r in runs),
            'grads': [[n, round(at[n], 6), nbytes[n]] for n in order]}


def write_atomic(path, data):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix='.tmp')
    try:
        head = {k: v for k, v in data.items() if k != 'grads'}
        with os.fdopen(fd, 'w') as f:  # one line per gradient
            f.write(json.dumps(head)[:-1] + ', "grads": [\n')
            f.write(',\n'.join(json.dumps(g) for g in data['grads']))
            f.write('\n]}\n')
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--arch', default='resnet50')
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--stem', default='imagenet')
    p.add_argument('--repeat', type=int, default=3)
    p.add_argument('--device', choices=('cpu', 'gpu'), default='cpu')
    p.add_argument('--out', default=DEFAULT_OUT)
    args = p.parse_args(argv)
    prof = measure(args.arch, args.batch, args.size, args.stem, args.repeat,
                   args.device)
    write_atomic(args.out, prof)
    grads = prof['grads']
    half = sum(b for _, _, b in grads) / 2
    done, when = 0, None
    for _, s, b in grads:
        done += b
        if when is None and done >= half:
            when = s
    print('{} batch {} at {} px on {}: forward {:.3f} s, backward {:.3f} s; '
          '{} gradients, half of their bytes final {:.0f}% into backward; '
          'wrote {}'.format(args.arch, args.batch, args.size, args.device,
                            prof['forward_s'], prof['backward_s'],
                            len(grads), 100 * when / prof['backward_s'],
                            args.out))


if __name__ == '__main__':
    main()
