"""SubDataset and the splits built on it (train/validation splits)."""
import numpy

from minichain.dataset.dataset_mixin import DatasetMixin

__all__ = ['SubDataset', 'split_dataset', 'split_dataset_random']


class SubDataset(DatasetMixin):
    """A view of ``dataset[start:finish]``, optionally through a
    permutation: ``sub[i] == dataset[order[start + i]]``.

    Args:
        dataset: the underlying dataset.
        start, finish: the range of (permuted) positions,
            ``0 <= start <= finish <= len(dataset)``.
        order: None (identity) or a permutation of ``range(len(dataset))``.
    """

    def __init__(self, dataset, start, finish, order=None):
        n = len(dataset)
        if not 0 <= start <= finish <= n:
            raise ValueError('SubDataset: need 0 <= start <= finish <= {} '
                             '(the dataset length), got start={}, finish={}'
                             .format(n, start, finish))
        if order is not None:
            order = numpy.asarray(order)
            if order.shape != (n,):
                raise ValueError('SubDataset: order has shape {}, but the '
                                 'dataset has length {}'.format(order.shape,
                                                                n))
        self._dataset = dataset
        self._start = int(start)
        self._finish = int(finish)
        self._order = order

    def __len__(self):
        return self._finish - self._start

    def get_example(self, i):
        index = self._start + i
        if self._order is not None:
            index = int(self._order[index])
        return self._dataset[index]


def split_dataset(dataset, split_at, order=None):
    """Split ``dataset`` into ``(first split_at examples, the rest)``.

    Args:
        dataset: the dataset.
        split_at: the size of the first part, ``0 <= split_at <= len``.
        order: an optional permutation applied first.

    Returns:
        two SubDatasets.
    """
    n = len(dataset)
    if not 0 <= split_at <= n:
        raise ValueError('split_dataset: split_at={} is outside [0, {}]'
                         .format(split_at, n))
    return (SubDataset(dataset, 0, split_at, order),
            SubDataset(dataset, split_at, n, order))


def split_dataset_random(dataset, first_size, seed=None):
    """Split ``dataset`` at random into parts of ``first_size`` and
    ``len(dataset) - first_size`` examples, disjoint and covering it.

    Args:
        dataset: the dataset.
        first_size: the size of the first part.
        seed: seed of the permutation (``numpy.random.default_rng``); the
            same seed gives the same split.

    Returns:
        two SubDatasets.
    """
    order = numpy.random.default_rng(seed).permutation(len(dataset))
    return split_dataset(dataset, first_size, order)
