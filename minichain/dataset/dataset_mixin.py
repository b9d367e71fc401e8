"""DatasetMixin: indexing (ints, slices, index lists) from ``get_example``."""
import numbers

import numpy

__all__ = ['DatasetMixin']


class DatasetMixin:
    """Base class of datasets that compute one example at a time.

    A subclass implements ``__len__`` and ``get_example(i)``; indexing with
    an int returns one example, with a slice, a list or an integer array it
    returns a list of examples. Negative indexes count from the end.
    """

    def __getitem__(self, index):
        if isinstance(index, slice):
            indices = range(*index.indices(len(self)))
            return [self.get_example(i) for i in indices]
        if isinstance(index, numbers.Integral):
            n = len(self)
            if not -n <= index < n:
                raise IndexError('{}: index {} is out of range for a dataset '
                                 'of length {}'.format(type(self).__name__,
                                                       index, n))
            return self.get_example(int(index) % n)
        if isinstance(index, (list, tuple, numpy.ndarray)):
            return [self[int(i)] for i in index]
        raise TypeError('{}: index must be an int, a slice or a list of ints, '
                        'got {}'.format(type(self).__name__,
                                        type(index).__name__))

    def __len__(self):
        raise NotImplementedError(type(self).__name__ + '.__len__')

    def get_example(self, i):
        """Return the ``i``-th example, ``0 <= i < len(self)``
        (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.get_example')
