"""MNIST from the standard IDX files in a local folder (no download).

Chainer's ``get_mnist`` downloads the files; here they are read from
``data_dir`` or ``$MINICHAIN_DATASET_ROOT/mnist``, under their usual names
(``train-images-idx3-ubyte`` and the other three, plain or ``.gz``).
"""
import os

import numpy

from minichain.datasets._idx import ENV_VAR, load_idx_dataset

__all__ = ['get_mnist']

SUBFOLDER = 'mnist'


def _search_dirs(data_dir):
    if data_dir is not None:
        return [os.fspath(data_dir)]
    root = os.environ.get(ENV_VAR)
    # Not the root itself: Fashion-MNIST's files have the same names.
    return [os.path.join(root, SUBFOLDER)] if root else []


def _how_to_get():
    root = os.environ.get(ENV_VAR)
    where = (os.path.join(root, SUBFOLDER) if root else
             '$' + ENV_VAR + '/' + SUBFOLDER + ' (' + ENV_VAR + ' is not set)')
    return ('Put the four files in {}, or pass get_mnist(data_dir=FOLDER); '
            'minichain does not download them.'.format(where))


def get_mnist(withlabel=True, ndim=1, scale=1.0, dtype=None,
              label_dtype=numpy.int32, rgb_format=False, data_dir=None):
    """Load MNIST (60000 training and 10000 test images of handwritten
    digits, 28x28, 10 classes) from local IDX files, with Chainer's
    ``get_mnist`` arguments.

    Files are looked for in ``data_dir`` if given, else in
    ``$MINICHAIN_DATASET_ROOT/mnist``.

    Args:
        withlabel: return ``(image, label)`` TupleDatasets; if False, the
            image arrays alone.
        ndim: 1 -> images of shape (784,); 2 -> (28, 28); 3 -> (1, 28, 28).
        scale: pixel values are scaled to ``[0, scale]``.
        dtype: image dtype (None: ``config.dtype``, float32 by default).
        label_dtype: label dtype.
        rgb_format: with ``ndim=3``, images of shape (3, 28, 28) (the gray
            channel three times).
        data_dir: the folder holding the four files.

    Returns:
        ``(train, test)``.

    Raises:
        FileNotFoundError: the files are not there (the message says where
            it looked and where to put them).
        ValueError: a file is corrupt (named), holds a label outside 0-9
            (named, with its index), ``ndim`` is not 1, 2, 3, or
            ``rgb_format`` is set without ``ndim=3``.
    """
    return load_idx_dataset('get_mnist', 'MNIST', _search_dirs(data_dir),
                            _how_to_get(), withlabel, ndim, scale, dtype,
                            label_dtype, rgb_format)
