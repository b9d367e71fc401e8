"""Fashion-MNIST from the standard IDX files (no download).

The four files keep their usual names, each plain or gzipped:
``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (``.gz``). Debian's
``dataset-fashion-mnist`` package installs the gzipped ones in
``/usr/share/datasets/fashion-mnist``.
"""
import gzip
import os
import struct
import zlib

import numpy

from minichain.datasets.tuple_dataset import TupleDataset

__all__ = ['get_fashion_mnist', 'read_idx']

DEBIAN_DIR = '/usr/share/datasets/fashion-mnist'
N_CLASSES = 10
ENV_VAR = 'MINICHAIN_DATASET_ROOT'
FILES = {
    'train': ('train-images-idx3-ubyte', 'train-labels-idx1-ubyte'),
    'test': ('t10k-images-idx3-ubyte', 't10k-labels-idx1-ubyte'),
}

# IDX type byte -> big-endian element dtype.
_IDX_DTYPES = {0x08: '>u1', 0x09: '>i1', 0x0B: '>i2', 0x0C: '>i4',
               0x0D: '>f4', 0x0E: '>f8'}


def read_idx(path):
    """Read an IDX file (plain or gzipped) into a NumPy array.

    The header is two zero bytes, a type byte, the number of axes ``d``,
    then ``d`` big-endian uint32 sizes; the elements follow, big-endian.

    Args:
        path: the file.

    Returns:
        an ndarray of the stored shape (native byte order).

    Raises:
        ValueError: bad gzip data, a bad magic number or a data size that
            does not match the header (the file is named).
    """
    with open(path, 'rb') as f:
        raw = f.read()
    if raw[:2] == b'\x1f\x8b':
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError('read_idx: {} is not a valid gzip file ({})'
                             .format(path, e)) from None
    if len(raw) < 4 or raw[:2] != b'\0\0' or raw[2] not in _IDX_DTYPES:
        raise ValueError('read_idx: {} is not an IDX file (magic number {}); '
                         'expected 0x0000TTDD with a known type TT'.format(
                             path, '0x' + raw[:4].hex()))
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError('read_idx: {} ends inside its header ({} bytes, '
                         '{} expected)'.format(path, len(raw), header))
    shape = struct.unpack('>{}I'.format(ndim), raw[4:header])
    dtype = numpy.dtype(_IDX_DTYPES[raw[2]])
    expected = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError('read_idx: {} holds {} bytes of data, but its header '
                         'declares shape {} ({} bytes)'.format(
                             path, len(raw) - header, shape, expected))
    array = numpy.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder('='))


def _search_dirs(data_dir):
    if data_dir is not None:
        return [os.fspath(data_dir)]
    dirs = []
    root = os.environ.get(ENV_VAR)
    if root:
        # The subfolder first: MNIST and Fashion-MNIST share file names.
        dirs += [os.path.join(root, 'fashion-mnist'), root]
    dirs.append(DEBIAN_DIR)
    return dirs


def _find(directory, name):
    for candidate in (name, name + '.gz'):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    return None


def _locate(data_dir):
    """``{name: path}`` of the four files from the first directory that has
    all of them; FileNotFoundError saying where it looked otherwise."""
    names = FILES['train'] + FILES['test']
    report = []
    for directory in _search_dirs(data_dir):
        found = {name: _find(directory, name) for name in names}
        missing = [n for n, p in found.items() if p is None]
        if not missing:
            return found
        if len(missing) == len(names):
            report.append('  {}: no Fashion-MNIST files'.format(directory))
        else:
            report.append('  {}: missing {}'.format(
                directory, ', '.join(missing)))
    raise FileNotFoundError(
        'get_fashion_mnist: the Fashion-MNIST IDX files ({}, plain or .gz) '
        'were not found. Looked in:\n{}\nInstall them with '
        '`apt-get install dataset-fashion-mnist` (into {}), or put them in a '
        'folder and pass data_dir= or set {} to it (or to its parent holding '
        'a fashion-mnist/ folder).'.format(
            ', '.join(names), '\n'.join(report), DEBIAN_DIR, ENV_VAR))


def _load_split(paths, ndim, scale, dtype, label_dtype):
    image_path, label_path = paths
    images = read_idx(image_path)
    labels = read_idx(label_path)
    if images.ndim != 3:
        raise ValueError('get_fashion_mnist: {} should hold images of shape '
                         '(N, rows, cols), got shape {}'.format(
                             image_path, images.shape))
    if labels.ndim != 1:
        raise ValueError('get_fashion_mnist: {} should hold labels of shape '
                         '(N,), got shape {}'.format(label_path, labels.shape))
    if len(images) != len(labels):
        raise ValueError('get_fashion_mnist: {} has {} images but {} has {} '
                         'labels'.format(image_path, len(images), label_path,
                                         len(labels)))
    bad = numpy.flatnonzero((labels < 0) | (labels >= N_CLASSES))
    if bad.size:
        raise ValueError('get_fashion_mnist: {} holds label {} at index {} '
                         '({} labels out of range); Fashion-MNIST labels are '
                         '0 to {}'.format(label_path, int(labels[bad[0]]),
                                          int(bad[0]), bad.size,
                                          N_CLASSES - 1))
    n, rows, cols = images.shape
    shape = {1: (n, rows * cols), 2: (n, rows, cols), 3: (n, 1, rows, cols)}
    images = images.reshape(shape[ndim]).astype(dtype)
    images *= numpy.asarray(scale / 255.0, dtype=dtype)
    return images, labels.astype(label_dtype)


def get_fashion_mnist(withlabel=True, ndim=1, scale=1.0, dtype=numpy.float32,
                      label_dtype=numpy.int32, data_dir=None):
    """Load Fashion-MNIST (60000 training and 10000 test images, 28x28,
    10 classes) from local IDX files.

    Files are looked for in ``data_dir`` if given; otherwise in
    ``$MINICHAIN_DATASET_ROOT/fashion-mnist``, ``$MINICHAIN_DATASET_ROOT``
    and ``/usr/share/datasets/fashion-mnist`` (Debian's
    ``dataset-fashion-mnist``), in that order.

    Args:
        withlabel: return ``(image, label)`` TupleDatasets; if False, the
            image arrays alone.
        ndim: 1 -> images of shape (784,); 2 -> (28, 28); 3 -> (1, 28, 28).
        scale: pixel values are scaled to ``[0, scale]``.
        dtype: image dtype.
        label_dtype: label dtype.
        data_dir: the folder holding the four files.

    Returns:
        ``(train, test)``.

    Raises:
        FileNotFoundError: no folder has the four files (the message lists
            where it looked and how to get them).
        ValueError: a file is corrupt (named), holds a label outside
            0-9 (named, with its index), or ``ndim`` is not 1, 2, 3.
    """
    if ndim not in (1, 2, 3):
        raise ValueError('get_fashion_mnist: ndim must be 1, 2 or 3, got {}'
                         .format(ndim))
    found = _locate(data_dir)
    result = []
    for split in ('train', 'test'):
        paths = [found[name] for name in FILES[split]]
        images, labels = _load_split(paths, ndim, scale, dtype, label_dtype)
        result.append(TupleDataset(images, labels) if withlabel else images)
    return tuple(result)
