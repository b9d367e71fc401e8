"""Data for models/train_resnet50.py: Fashion-MNIST, ImageNet folders, noise,
their iterators, and the updater that seeds the crops.

Every function that can fail on bad input raises
:class:`~models.train_checks.UserError` (one line for the user); they run on
every rank through ``train_checks.agree``, so that all ranks stop together.

* Fashion-MNIST and synthetic images are arrays: rank 0 loads them and
  ``scatter_dataset`` sends each rank its shard (ChainerMN's way).
* ImageNet (``DIR/train/<class>/*``, ``DIR/val/<class>/*``): every rank lists
  the folders itself and ``scatter_index`` gives it its share of the file
  list; images are decoded lazily (in ``--loaderjob`` worker processes, or
  in the training process) and their shorter side resized to
  ``crop * 256 / 224`` as 8-bit pixels; the converter, in the training
  process, crops them (random + flip for training, center for validation)
  and normalizes them per channel, so that the crops follow the iteration
  whatever decoded the images.
"""
import collections
import os
import time
import warnings

import numpy

import minichain
from minichain import dist, training
from minichain.dataset import DatasetMixin, concat_examples
from minichain.datasets import (ImageFolderDataset, TupleDataset,
                                get_fashion_mnist)
from minichain.iterators import MultiprocessIterator, SerialIterator
from models.train_checks import UserError, agree, fingerprint

FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
IMAGENET_MEAN = numpy.array([0.485, 0.456, 0.406], numpy.float32) * 255
IMAGENET_STD = numpy.array([0.229, 0.224, 0.225], numpy.float32) * 255
SYNTHETIC_SIZE = (512, 128)  # default train / validation lengths


def get_device(kind, intra_rank, intra_size=1):
    """The host, or this rank's GPU among the visible ones (made current)
    for ``kind='gpu'``."""
    if kind == 'cpu':
        return minichain.get_device(-1)
    try:
        device = minichain.device.get_rank_device(intra_rank, intra_size)
    except RuntimeError as e:
        raise UserError('--device gpu: {}'.format(e))
    device.use()
    return device


def check_shard(args, shard_len, size):
    """Refuse a per-rank batch that the training shard cannot fill."""
    if args.batchsize > shard_len:
        raise UserError(
            '--batchsize {} is larger than each rank\'s shard of {} training '
            'images ({} processes); use --batchsize {} or less, or more data'
            .format(args.batchsize, shard_len, size, shard_len))


def _subset(columns, n, seed, what):
    if n is None:
        return columns
    if n > len(columns[0]):
        raise UserError('--{}-subset {} is larger than the {} set ({} images)'
                        .format(what, n, what, len(columns[0])))
    idx = numpy.sort(numpy.random.default_rng(seed).permutation(
        len(columns[0]))[:n])
    return tuple(c[idx] for c in columns)


def _arrays(args):
    """``((x, t), (x_val, t_val), n_classes, channels)`` on rank 0."""
    if args.data == 'synthetic':
        rng = numpy.random.default_rng(args.seed)
        n, n_val = args.train_subset or SYNTHETIC_SIZE[0], \
            args.val_subset or SYNTHETIC_SIZE[1]
        s = args.image_size
        return ((rng.standard_normal((n, 3, s, s), numpy.float32),
                 rng.integers(0, 10, n).astype(numpy.int32)),
                (rng.standard_normal((n_val, 3, s, s), numpy.float32),
                 rng.integers(0, 10, n_val).astype(numpy.int32)), 10, 3)
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        raise UserError('--data-dir {}: no such folder'.format(args.data_dir))
    try:
        train, test = get_fashion_mnist(ndim=3, data_dir=args.data_dir)
    except (OSError, ValueError) as e:
        raise UserError(e)
    train, test = [tuple(d.datasets) for d in (train, test)]
    for x, _ in (train, test):
        x -= FASHION_MEAN
        x /= FASHION_STD
    n = args.train_subset
    limit = getattr(args, 'train_limit', None)
    if n is None and limit is not None and len(train[0]) > limit:
        n = limit
    return (_subset(train, n, args.seed, 'train'),
            _subset(test, args.val_subset, args.seed + 1, 'val'), 10, 1)


Unreadable = collections.namedtuple('Unreadable', 'index')


class _Shard(DatasetMixin):
    """``shard[i]``: image ``indices[i]`` of ``base`` resized by ``_resize``.
    An unreadable image is ``Unreadable(indices[i])``, so that the
    converter counts each one once, also when a loader worker read it."""

    def __init__(self, base, indices, side):
        self.base, self.indices = base, numpy.asarray(indices)
        self.side = side

    def __len__(self):
        return len(self.indices)

    def get_example(self, i):
        index = int(self.indices[i])
        example = _resize(self.base[index], self.side)
        return Unreadable(index) if example is None else example


def _resize(example, side):
    """Scale the shorter side of a (C, H, W) 8-bit image to ``side`` (None,
    for an unreadable image, passes through)."""
    if example is None:
        return None
    image, label = example
    _, h, w = image.shape
    if min(h, w) != side:
        from PIL import Image
        size = (max(side, round(w * side / min(h, w))),
                max(side, round(h * side / min(h, w))))
        pil = Image.fromarray(image.transpose(1, 2, 0).astype(numpy.uint8))
        image = numpy.asarray(pil.resize(size, Image.BILINEAR)).transpose(
            2, 0, 1)
    return image, label


def _image_folders(args):
    """The train and val ImageFolderDatasets (every rank)."""
    root = args.data_dir
    if root is None:
        raise UserError('--data imagenet needs --data-dir DIR (holding '
                        'train/<class>/* and val/<class>/*)')
    for split in ('train', 'val'):
        folder = os.path.join(root, split)
        if not os.path.isdir(folder):
            raise UserError('--data-dir {}: no {} folder (expected '
                            '{}/<class>/<image>)'.format(root, split, folder))
    found = []
    for split in ('train', 'val'):
        folder = os.path.join(root, split)
        try:
            with warnings.catch_warnings():  # empty classes: an error below
                warnings.simplefilter('ignore')
                ds = ImageFolderDataset(folder, numpy.uint8,
                                        on_error='skip')
        except (OSError, ValueError, ImportError) as e:
            raise UserError(e)
        counts = numpy.bincount([t for _, t in ds.pairs],
                                minlength=len(ds.classes))
        empty = [c for c, n in zip(ds.classes, counts) if n == 0]
        if empty:
            raise UserError('class folder {} has no images'.format(
                os.path.join(folder, empty[0])) + (
                    ' ({} empty class folders)'.format(len(empty))
                    if len(empty) > 1 else ''))
        found.append(ds)
    if found[0].classes != found[1].classes:
        raise UserError('{}/train and {}/val have different class folders'
                        .format(root, root))
    return found


class CropConverter:
    """Crop (random with a flip when ``train``, else central) and normalize
    each image, leave out unreadable ones (None, or ``Unreadable`` whose
    index is kept in ``unreadable``), batch with ``concat_examples``.
    ``reseed`` restarts the random crops."""

    def __init__(self, crop, train):
        self.crop, self.train = crop, train
        self.rng = numpy.random.default_rng(0)
        self.unreadable = set()

    def reseed(self, seed):
        self.rng = numpy.random.default_rng(seed)

    def __call__(self, batch, device=None):
        out, c = [], self.crop
        for example in batch:
            if isinstance(example, Unreadable):
                self.unreadable.add(example.index)
            if example is None or isinstance(example, Unreadable):
                continue
            image, label = example
            _, h, w = image.shape
            if self.train:
                top, left = self.rng.integers(h - c + 1), \
                    self.rng.integers(w - c + 1)
            else:
                top, left = (h - c) // 2, (w - c) // 2
            image = image[:, top:top + c, left:left + c]
            if self.train and self.rng.random() < 0.5:
                image = image[:, :, ::-1]
            image = (image - IMAGENET_MEAN[:, None, None]) / \
                IMAGENET_STD[:, None, None]
            out.append((image.astype(numpy.float32), label))
        if not out:
            raise UserError('every image of a batch of {} was unreadable (see '
                            'the warnings above): fix or remove them'.format(
                                len(batch)))
        return concat_examples(out, device)


def load(args, comm):
    """This rank's ``(train, val, n_classes, channels, converters)``.

    ``converters`` is ``(train converter, val converter, skipped,
    fingerprint)`` where ``skipped()`` counts this rank's unreadable images
    (or None) and ``fingerprint`` tells the training sets apart (the same
    on every rank)."""
    if args.data == 'imagenet':
        train, val = agree(comm, _image_folders, args)
        n = len(train) if args.train_subset is None else min(
            args.train_subset, len(train))
        pick = numpy.random.default_rng(args.seed).permutation(len(train))[:n]
        mine = pick[dist.scatter_index(n, comm, shuffle=True, seed=args.seed)]
        n_val = len(val) if args.val_subset is None else min(
            args.val_subset, len(val))
        mine_val = dist.scatter_index(n_val, comm, force_equal_length=False)
        side = round(args.image_size * 256 / 224)
        shards = [_Shard(ds, idx, side)
                  for ds, idx in ((train, mine), (val, mine_val))]
        crops = (CropConverter(args.image_size, True),
                 CropConverter(args.image_size, False))
        files = '\n'.join(p for p, _ in train.pairs).encode()
        converters = crops + (
            lambda: sum(len(c.unreadable) for c in crops),
            fingerprint(numpy.frombuffer(files, numpy.uint8), pick))
        return shards[0], shards[1], len(train.classes), 3, converters
    data = agree(comm, _arrays, args) if comm.rank == 0 else agree(
        comm, lambda: None)
    n_classes, channels, print_ = comm.bcast_obj(data and (
        data[2:] + (fingerprint(*data[0]),)))
    train = dist.scatter_dataset(data and data[0], comm, shuffle=True,
                                 seed=args.seed)
    val = dist.scatter_dataset(data and data[1], comm,
                               force_equal_length=False)
    return (TupleDataset(*train), TupleDataset(*val), n_classes, channels,
            (concat_examples, concat_examples, None, print_))


def iterators(args, comm, train, val):
    """The training and validation iterators: SerialIterator, or with
    ``--loaderjob N`` a MultiprocessIterator (same batches and snapshot
    keys) whose N workers decode while the step runs. By default only
    ImageNet on a GPU uses workers, one per core of the rank's share but
    the training process's: array data has nothing to decode, and on the
    CPU the step already keeps every core of the rank busy."""
    jobs = args.loaderjob
    if jobs is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(
            os, 'sched_getaffinity') else (os.cpu_count() or 1)
        jobs = max(1, cores // comm.intra_size - 1) if (
            args.data == 'imagenet' and args.device == 'gpu') else 0
    if not jobs:
        return (SerialIterator(train, args.batchsize, seed=args.seed),
                SerialIterator(val, args.val_batchsize, repeat=False,
                               shuffle=False))
    return (MultiprocessIterator(train, args.batchsize, seed=args.seed,
                                 n_processes=jobs, n_prefetch=2),
            MultiprocessIterator(val, args.val_batchsize, repeat=False,
                                 shuffle=False, n_processes=jobs))


class Updater(training.StandardUpdater):
    """StandardUpdater that reseeds the converter's crops from ``seed`` and
    the iteration, so that a resumed run draws the crops of an
    uninterrupted one, and times its updates: ``images_per_sec()`` is the
    throughput of the updates alone (evaluations and snapshots left out)
    since its last call, ``images`` images (all ranks) an update."""

    def __init__(self, *args, seed, images, **kwds):
        super().__init__(*args, **kwds)
        self._seed, self.images = tuple(seed), images
        self._done, self._seconds = 0, 0.0

    def update_core(self):
        if hasattr(self.converter, 'reseed'):
            self.converter.reseed(self._seed + (self.iteration,))
        start = time.perf_counter()
        super().update_core()
        self._seconds += time.perf_counter() - start
        self._done += self.images

    def images_per_sec(self):
        """Images per second (all ranks) since the last call."""
        rate = self._done / self._seconds if self._seconds else 0.0
        self._done, self._seconds = 0, 0.0
        return rate
