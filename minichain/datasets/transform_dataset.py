"""TransformDataset: a dataset whose examples pass through a function."""
from minichain.dataset.dataset_mixin import DatasetMixin

__all__ = ['TransformDataset']


class TransformDataset(DatasetMixin):
    """``ds[i] == transform(dataset[i])``, computed on access.

    Args:
        dataset: the underlying dataset.
        transform: a function of one example (data augmentation,
            normalization); it may return any example.
    """

    def __init__(self, dataset, transform):
        if not callable(transform):
            raise TypeError('TransformDataset: transform must be callable, '
                            'got {}'.format(type(transform).__name__))
        self._dataset = dataset
        self._transform = transform

    def __len__(self):
        return len(self._dataset)

    def get_example(self, i):
        return self._transform(self._dataset[i])
