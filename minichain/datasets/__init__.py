"""minichain.datasets: datasets and the tools that slice and transform them.

Any object with ``__len__`` and ``__getitem__`` is a dataset; an example is
usually a tuple ``(x, t)``.
"""
from minichain.datasets.tuple_dataset import TupleDataset  # noqa: F401
from minichain.datasets.sub_dataset import (SubDataset,  # noqa: F401
                                            split_dataset,
                                            split_dataset_random)
from minichain.datasets.transform_dataset import TransformDataset  # noqa
from minichain.datasets.fashion_mnist import (get_fashion_mnist,  # noqa: F401
                                              read_idx)
from minichain.datasets.mnist import get_mnist  # noqa: F401
from minichain.datasets.image_dataset import (ImageFolderDataset,  # noqa
                                              LabeledImageDataset)
