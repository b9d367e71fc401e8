"""SerialIterator: batches read in order or in a seeded shuffled order."""
import numbers

import numpy

from minichain.dataset.iterator import Iterator

__all__ = ['SerialIterator']


def _random_seed():
    """A fresh 63-bit seed (fits the int64 a snapshot stores)."""
    return int(numpy.random.SeedSequence().generate_state(
        1, numpy.uint64)[0] >> numpy.uint64(1))


class SerialIterator(Iterator):
    """Reads batches of ``batch_size`` examples from ``dataset``.

    With ``repeat=True`` it loops forever; a batch that crosses the end of
    an epoch continues with the next epoch's order, so every batch is full.
    With ``repeat=False`` it stops after one epoch (the last batch may be
    shorter).

    Shuffling is reproducible: epoch ``e`` visits the examples in the order
    ``numpy.random.default_rng([seed, e]).permutation(len(dataset))``.
    A resumed iterator therefore continues exactly where it stopped.

    Args:
        dataset: the dataset (``len`` and integer indexing).
        batch_size: examples per batch (positive int).
        repeat: loop over the dataset forever.
        shuffle: shuffle every epoch (None means True, as in Chainer).
        seed: the shuffling seed; None draws one at random (it is saved in
            snapshots, so a resumed run keeps the same orders).

    Attributes:
        epoch: number of completed epochs.
        is_new_epoch: True just after the batch that completed an epoch.
        current_position: position inside the current epoch.
    """

    def __init__(self, dataset, batch_size, repeat=True, shuffle=None,
                 seed=None):
        if (not isinstance(batch_size, numbers.Integral)
                or isinstance(batch_size, bool) or batch_size <= 0):
            raise ValueError('SerialIterator: batch_size must be a positive '
                             'int, got {!r}'.format(batch_size))
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self._repeat = repeat
        self._shuffle = True if shuffle is None else bool(shuffle)
        self._seed = _random_seed() if seed is None else int(seed)
        self.reset()

    @property
    def repeat(self):
        """Whether the iterator loops forever."""
        return self._repeat

    @property
    def shuffle(self):
        """Whether each epoch is shuffled."""
        return self._shuffle

    @property
    def seed(self):
        """The shuffling seed."""
        return self._seed

    def _order_for(self, epoch):
        if not self._shuffle:
            return None
        rng = numpy.random.default_rng([self._seed, epoch])
        return rng.permutation(len(self.dataset))

    def reset(self):
        """Go back to the start of epoch 0."""
        self.current_position = 0
        self.epoch = 0
        self.is_new_epoch = False
        self._order = self._order_for(0)
        self._previous_epoch_detail = -1.0

    def __next__(self):
        n = len(self.dataset)
        if n == 0:
            raise ValueError('SerialIterator: the dataset is empty')
        if not self._repeat and self.epoch > 0:
            raise StopIteration
        self._previous_epoch_detail = self.epoch_detail
        indices = []
        self.is_new_epoch = False
        while len(indices) < self.batch_size:
            take = min(self.batch_size - len(indices),
                       n - self.current_position)
            stop = self.current_position + take
            if self._order is None:
                indices.extend(range(self.current_position, stop))
            else:
                indices.extend(self._order[self.current_position:stop])
            self.current_position = stop
            if stop == n:
                self.epoch += 1
                self.is_new_epoch = True
                self.current_position = 0
                self._order = self._order_for(self.epoch)
                if not self._repeat:
                    break
        return [self.dataset[int(i)] for i in indices]

    @property
    def epoch_detail(self):
        """Epochs done, with a fraction: ``epoch + position / len``."""
        return self.epoch + self.current_position / len(self.dataset)

    @property
    def previous_epoch_detail(self):
        """``epoch_detail`` before the last batch (None before the first)."""
        if self._previous_epoch_detail < 0:
            return None
        return self._previous_epoch_detail

    def serialize(self, serializer):
        """Save or load the position, epoch, flags, seed and the current
        epoch's order (Chainer's keys, plus ``seed``)."""
        self.current_position = int(serializer('current_position',
                                               self.current_position))
        self.epoch = int(serializer('epoch', self.epoch))
        self.is_new_epoch = bool(serializer('is_new_epoch', self.is_new_epoch))
        self._seed = int(serializer('seed', self._seed))
        if self._order is not None:
            self._order = serializer('order', self._order)
        self._previous_epoch_detail = float(serializer(
            'previous_epoch_detail', self._previous_epoch_detail))

    def __repr__(self):
        return ('SerialIterator(len(dataset)={}, batch_size={}, repeat={}, '
                'shuffle={}, seed={})'.format(len(self.dataset),
                                              self.batch_size, self._repeat,
                                              self._shuffle, self._seed))
