"""The MNIST family's files: IDX reading, finding the four files, and turning
them into datasets (shared by get_mnist and get_fashion_mnist).

The four files keep their usual names, each plain or gzipped:
``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (``.gz``).
"""
import gzip
import os
import struct
import zlib

import numpy

from minichain.configuration import get_dtype
from minichain.datasets.tuple_dataset import TupleDataset

__all__ = ['ENV_VAR', 'FILES', 'read_idx', 'load_idx_dataset']

ENV_VAR = 'MINICHAIN_DATASET_ROOT'
N_CLASSES = 10  # MNIST's digits, Fashion-MNIST's garments
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


def _find(directory, name):
    for candidate in (name, name + '.gz'):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    return None


def _locate(caller, title, directories, how_to_get):
    """``{name: path}`` of the four files from the first directory that has
    all of them; FileNotFoundError saying where it looked otherwise."""
    names = FILES['train'] + FILES['test']
    report = []
    for directory in directories:
        found = {name: _find(directory, name) for name in names}
        missing = [n for n, p in found.items() if p is None]
        if not missing:
            return found
        if len(missing) == len(names):
            report.append('  {}: no {} files'.format(directory, title))
        else:
            report.append('  {}: missing {}'.format(
                directory, ', '.join(missing)))
    where = ('. Looked in:\n' + '\n'.join(report) if report else
             ' (no folder to look in)')
    raise FileNotFoundError(
        '{}: the {} IDX files ({}, plain or .gz) were not found{}\n{}'.format(
            caller, title, ', '.join(names), where, how_to_get))


def _check_labels(caller, title, label_path, labels):
    """ValueError naming the file, the first bad label and its index unless
    every label is a whole number from 0 to 9. An IDX file may store floats:
    checked before any cast, since ``astype(int32)`` truncates 9.99 to 9,
    -0.7 to 0 and NaN to -2**31 without a word."""
    if labels.dtype.kind == 'f':
        bad = numpy.flatnonzero(~numpy.isfinite(labels) |
                                (labels != numpy.floor(labels)))
        if bad.size:
            raise ValueError(
                '{}: {} holds label {} at index {} ({} labels not whole '
                'numbers); {} labels are 0 to {}'.format(
                    caller, label_path, str(labels[bad[0]]), int(bad[0]),
                    bad.size, title, N_CLASSES - 1))
    bad = numpy.flatnonzero((labels < 0) | (labels >= N_CLASSES))
    if bad.size:
        value = labels[bad[0]]  # str(): 12.0 for a float, not np.float32(12)
        value = int(value) if labels.dtype.kind in 'iu' else str(value)
        raise ValueError('{}: {} holds label {} at index {} ({} labels out of '
                         'range); {} labels are 0 to {}'.format(
                             caller, label_path, value, int(bad[0]),
                             bad.size, title, N_CLASSES - 1))


def _load_split(caller, title, paths, ndim, scale, dtype, label_dtype,
                rgb_format):
    image_path, label_path = paths
    images = read_idx(image_path)
    labels = read_idx(label_path)
    if images.ndim != 3:
        raise ValueError('{}: {} should hold images of shape (N, rows, cols), '
                         'got shape {}'.format(caller, image_path,
                                               images.shape))
    if labels.ndim != 1:
        raise ValueError('{}: {} should hold labels of shape (N,), got shape '
                         '{}'.format(caller, label_path, labels.shape))
    if len(images) != len(labels):
        raise ValueError('{}: {} has {} images but {} has {} labels'.format(
            caller, image_path, len(images), label_path, len(labels)))
    _check_labels(caller, title, label_path, labels)
    n, rows, cols = images.shape
    shape = {1: (n, rows * cols), 2: (n, rows, cols), 3: (n, 1, rows, cols)}
    images = images.reshape(shape[ndim]).astype(dtype)
    images *= numpy.asarray(scale / 255.0, dtype=dtype)
    if rgb_format:  # the gray channel three times, as Chainer does
        images = numpy.ascontiguousarray(
            numpy.broadcast_to(images, (n, 3, rows, cols)))
    return images, labels.astype(label_dtype)


def load_idx_dataset(caller, title, directories, how_to_get, withlabel=True,
                     ndim=1, scale=1.0, dtype=None, label_dtype=numpy.int32,
                     rgb_format=False):
    """``(train, test)`` from the four files of the first of ``directories``
    that holds them all (the arguments of ``get_mnist``).

    Args:
        caller: the public function's name, for messages.
        title: the data set's name, for messages (``'MNIST'``).
        directories: where to look, in order.
        how_to_get: the last paragraph of the missing-files message.
        withlabel, ndim, scale, dtype, label_dtype, rgb_format: see
            :func:`minichain.datasets.get_mnist`.

    Raises:
        FileNotFoundError: no directory has the four files (the message
            lists where it looked, then ``how_to_get``).
        ValueError: a corrupt file (named), a label outside 0-9 or not a
            whole number (named, with its index), ``ndim`` not 1, 2 or 3,
            or ``rgb_format`` without ``ndim=3``.
    """
    if ndim not in (1, 2, 3):
        raise ValueError('{}: ndim must be 1, 2 or 3, got {}'.format(caller,
                                                                     ndim))
    if rgb_format and ndim != 3:
        raise ValueError('{}: rgb_format=True makes images of shape (3, 28, '
                         '28), so it needs ndim=3 (got ndim={})'.format(
                             caller, ndim))
    dtype = get_dtype(dtype)
    found = _locate(caller, title, directories, how_to_get)
    result = []
    for split in ('train', 'test'):
        paths = [found[name] for name in FILES[split]]
        images, labels = _load_split(caller, title, paths, ndim, scale,
                                     dtype, label_dtype, rgb_format)
        result.append(TupleDataset(images, labels) if withlabel else images)
    return tuple(result)
