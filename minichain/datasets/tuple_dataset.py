"""TupleDataset: several equal-length datasets zipped into one."""
import numbers

__all__ = ['TupleDataset']


class TupleDataset:
    """Zips datasets: ``ds[i] == (d0[i], d1[i], ...)``.

    Args:
        *datasets: one or more datasets (arrays, lists, ...) of equal
            length.

    Indexing with an int gives one tuple; with a slice or an index list it
    gives a list of tuples.

    Example::

        train = TupleDataset(images, labels)
        x, t = train[0]
    """

    def __init__(self, *datasets):
        if not datasets:
            raise ValueError('TupleDataset: give at least one dataset')
        lengths = [len(d) for d in datasets]
        if len(set(lengths)) != 1:
            raise ValueError('TupleDataset: datasets have different lengths '
                             '{}'.format(lengths))
        self._datasets = datasets
        self._length = lengths[0]

    def __getitem__(self, index):
        items = [d[index] for d in self._datasets]
        if isinstance(index, numbers.Integral):
            return tuple(items)
        return list(zip(*items))

    def __len__(self):
        return self._length

    @property
    def datasets(self):
        """The zipped datasets, as a tuple."""
        return self._datasets
