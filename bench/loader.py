"""ImageNet loading per rank: SerialIterator against MultiprocessIterator.

    python bench/loader.py [--images 2000] [--workers 0,1,2] [--batches 20]
        [--repeat 3] [--step-config 32x28:small2] [--steps 6] [--dir DIR]

The first run writes an ImageNet-like tree of ``--images`` 500x375 JPEGs
(quality 90, smooth random colours plus fine noise: about 100 KB each,
near ImageNet's mean file size) under
``--dir`` (default: a folder in the temporary directory, kept for the next
runs). The images go through models/train_data.py's own pipeline: decode,
shorter side to 256 (8-bit), then the training converter's random 224 crop,
flip and normalization in this process, batch 32.

1. **Loader alone**: batches per second with 0 workers (the training
   process decodes) and with 1, 2... worker processes; images per second,
   and the CPU time this process spends per batch (unpacking the shared
   memory, cropping, normalizing): what a GPU rank's own core pays.
2. **Beside a CPU training step** (minichain's ResNet-50 at
   ``--step-config``, synthetic input, using every core): each iteration
   takes the next converted batch, then steps. Printed: the median step
   time with the workers decoding in the background against the same step
   with no workers (the ratio: how much the workers slow the step), and
   the images per second of the whole loop.

Configurations take turns in every round (``--repeat``), so that the
machine's drift falls on all of them alike; medians are printed.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

CLASSES = 10
SIZE = (500, 375)


def write_tree(folder, n):
    """``n`` JPEGs in ``folder/train/<class>/``, once (a marker file says the
    tree is complete; each image is written under a temporary name first)."""
    done = os.path.join(folder, 'complete')
    if os.path.exists(done):
        return
    from PIL import Image
    rng = numpy.random.default_rng(0)
    start = time.perf_counter()
    for i in range(n):
        cls = os.path.join(folder, 'train', 'n{:08d}'.format(i % CLASSES))
        os.makedirs(cls, exist_ok=True)
        path = os.path.join(cls, 'img{:06d}.JPEG'.format(i))
        if os.path.exists(path):
            continue
        # smooth colour fields plus fine noise: a natural image's file size
        coarse = rng.integers(0, 256, (12, 16, 3), numpy.uint8)
        image = numpy.asarray(Image.fromarray(coarse).resize(
            SIZE, Image.BICUBIC), numpy.int16)
        image += rng.integers(-32, 33, image.shape, numpy.int16)
        Image.fromarray(image.clip(0, 255).astype(numpy.uint8)).save(
            path + '.tmp', 'JPEG', quality=90)
        os.replace(path + '.tmp', path)
    with open(done, 'w') as f:
        f.write('{}\n'.format(n))
    print('wrote {} JPEGs of {}x{} in {} ({:.0f} s)'.format(
        n, SIZE[0], SIZE[1], folder, time.perf_counter() - start), flush=True)


def make_loader(root, workers, batch, seed):
    """(iterator, converter) as models/train_data.py builds them."""
    from minichain.datasets import ImageFolderDataset
    from minichain.iterators import MultiprocessIterator, SerialIterator
    from models import train_data
    base = ImageFolderDataset(os.path.join(root, 'train'), numpy.uint8,
                              on_error='skip')
    shard = train_data._Shard(base, numpy.arange(len(base)), 256)
    converter = train_data.CropConverter(224, True)
    if workers == 0:
        return SerialIterator(shard, batch, seed=seed), converter
    return MultiprocessIterator(shard, batch, seed=seed, n_processes=workers,
                                n_prefetch=2), converter


def loader_alone(root, workers, args):
    """(images per second, CPU ms of this process per batch)."""
    it, convert = make_loader(root, workers, args.batch, args.seed)
    try:
        for _ in range(2):  # workers start, shared memory is sized
            convert(next(it))
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.batches):
            convert(next(it))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        it.finalize()
    return args.batches * args.batch / wall, 1000 * cpu / args.batches


def beside_step(root, workers, step, args):
    """(median step seconds, loop images per second)."""
    it, convert = make_loader(root, workers, args.batch, args.seed)
    steps = []
    try:
        convert(next(it))
        step()
        start = time.perf_counter()
        for _ in range(args.steps):
            convert(next(it))
            steps.append(step())
        loop = time.perf_counter() - start
    finally:
        it.finalize()
    return statistics.median(steps), args.steps * args.batch / loop


def parse_config(text):
    import resnet50_step
    return None if text == 'none' else resnet50_step.parse_config(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--images', type=int, default=2000)
    p.add_argument('--dir', help='where the JPEG tree is (written if absent)')
    p.add_argument('--workers', default='0,1,2',
                   type=lambda s: [int(v) for v in s.split(',')])
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--batches', type=int, default=20,
                   help='timed batches per loader measurement')
    p.add_argument('--repeat', type=int, default=3)
    p.add_argument('--step-config', type=parse_config, default='32x28:small2',
                   help="the CPU step beside the loader, BATCHxSIZE:STEM "
                   "('none' skips part 2)")
    p.add_argument('--steps', type=int, default=6)
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args()
    folder = args.dir or os.path.join(
        tempfile.gettempdir(), 'minichain-bench-loader',
        '{}x{}x{}'.format(args.images, *SIZE))
    write_tree(folder, args.images)
    cores = len(os.sched_getaffinity(0))
    print('{} cores; batch {}; {} rounds; images from {}'.format(
        cores, args.batch, args.repeat, folder), flush=True)

    alone = {w: [] for w in args.workers}
    for r in range(args.repeat):
        for w in args.workers[r % len(args.workers):] + \
                args.workers[:r % len(args.workers)]:
            alone[w].append(loader_alone(folder, w, args))
    print('\n1. loader alone: {} batches per measurement'.format(
        args.batches))
    print('{:>8} {:>10} {:>14} {:>22}'.format(
        'workers', 'images/s', 'per worker', 'this process CPU/batch'))
    rate = {w: statistics.median(v[0] for v in alone[w]) for w in alone}
    for w in args.workers:
        print('{:>8} {:>10.1f} {:>14} {:>19.1f} ms'.format(
            w, rate[w], '{:.1f}'.format(rate[w] / w) if w else '-',
            statistics.median(v[1] for v in alone[w])))
    if 1 in rate:
        host = statistics.median(v[1] for v in alone[1])
        print('one worker decodes {:.0f} images/s; a GPU rank stepping at '
              'T images/s needs about T / {:.0f} workers (and cores), and '
              'this process tops out at {:.0f} images/s ({:.1f} ms of its '
              'own CPU per batch of {})'.format(
                  rate[1], rate[1], 1000 * args.batch / host, host,
                  args.batch))

    if args.step_config is None:
        return
    import resnet50_step
    step = resnet50_step.minichain_step(*args.step_config)
    beside = {w: [] for w in args.workers}
    for r in range(args.repeat):
        for w in args.workers[r % len(args.workers):] + \
                args.workers[:r % len(args.workers)]:
            beside[w].append(beside_step(folder, w, step, args))
    print('\n2. beside a CPU step (ResNet-50, {}x{}:{}, {} steps per '
          'measurement)'.format(*args.step_config, args.steps))
    print('{:>8} {:>10} {:>20} {:>12}'.format(
        'workers', 'step s', 'step vs 0 workers', 'loop img/s'))
    base = beside[0 if 0 in beside else args.workers[0]]
    for w in args.workers:  # each round's ratio: measured seconds apart
        pairs = [v[0] / b[0] for v, b in zip(beside[w], base)]
        print('{:>8} {:>10.3f} {:>15.2f}x ({:.2f}-{:.2f}) {:>8.1f}'.format(
            w, statistics.median(v[0] for v in beside[w]),
            statistics.median(pairs), min(pairs), max(pairs),
            statistics.median(v[1] for v in beside[w])))


if __name__ == '__main__':
    import minichain.host
    minichain.host.tune_malloc()  # as the training scripts do
    main()
