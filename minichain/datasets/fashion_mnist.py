"""Fashion-MNIST from the standard IDX files (no download).

The four files keep their MNIST names (see :mod:`minichain.datasets._idx`).
Debian's ``dataset-fashion-mnist`` package installs the gzipped ones in
``/usr/share/datasets/fashion-mnist``.
"""
import os

import numpy

from minichain.datasets._idx import (ENV_VAR, FILES,  # noqa: F401
                                     N_CLASSES, load_idx_dataset, read_idx)

__all__ = ['get_fashion_mnist', 'read_idx']

DEBIAN_DIR = '/usr/share/datasets/fashion-mnist'


def _search_dirs(data_dir):
    if data_dir is not None:
        return [os.fspath(data_dir)]
    root = os.environ.get(ENV_VAR)
    # The subfolder first: MNIST and Fashion-MNIST share file names.
    dirs = [os.path.join(root, 'fashion-mnist'), root] if root else []
    return dirs + [DEBIAN_DIR]


def get_fashion_mnist(withlabel=True, ndim=1, scale=1.0, dtype=None,
                      label_dtype=numpy.int32, rgb_format=False,
                      data_dir=None):
    """Load Fashion-MNIST (60000 training and 10000 test images, 28x28,
    10 classes) from local IDX files.

    Files are looked for in ``data_dir`` if given; otherwise in
    ``$MINICHAIN_DATASET_ROOT/fashion-mnist``, ``$MINICHAIN_DATASET_ROOT``
    and ``/usr/share/datasets/fashion-mnist`` (Debian's
    ``dataset-fashion-mnist``), in that order.

    Args:
        withlabel, ndim, scale, dtype, label_dtype, rgb_format: as for
            :func:`minichain.datasets.get_mnist` (Chainer's arguments).
        data_dir: the folder holding the four files.

    Returns:
        ``(train, test)``: TupleDatasets of (image, label), or the image
        arrays alone without labels.

    Raises:
        FileNotFoundError: no folder has the four files (the message lists
            where it looked and how to get them).
        ValueError: a file is corrupt (named), holds a label outside 0-9
            (named, with its index), or a bad ``ndim`` / ``rgb_format``.
    """
    how = ('Install them with `apt-get install dataset-fashion-mnist` (into '
           '{}), or put them in a folder and pass data_dir= or set {} to it '
           '(or to its parent holding a fashion-mnist/ folder).'.format(
               DEBIAN_DIR, ENV_VAR))
    return load_idx_dataset('get_fashion_mnist', 'Fashion-MNIST',
                            _search_dirs(data_dir), how, withlabel, ndim,
                            scale, dtype, label_dtype, rgb_format)
