"""minichain.dataset: the pieces every dataset and iterator builds on.

``concat_examples`` turns a list of examples into batched arrays (the
default converter of updaters and evaluators); ``DatasetMixin`` and
``Iterator`` are the base classes of datasets and iterators. The datasets
themselves live in ``minichain.datasets``.
"""
from minichain.dataset.convert import (concat_examples,  # noqa: F401
                                       drop_none, to_device)
from minichain.dataset.dataset_mixin import DatasetMixin  # noqa: F401
from minichain.dataset.iterator import Iterator  # noqa: F401
