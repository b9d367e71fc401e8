"""NumPy ``.npz`` files: save_npz, load_npz and the serializers behind them.

Keys are paths such as ``'l1/W'`` or ``'updater/optimizer:main/l1/W/v'``
(Chainer's layout, so Chainer's npz files load). Scalars are stored as 0-d
arrays; files are read with ``allow_pickle=False``, so only numeric, boolean
and string values are stored (a None value is simply not written).
"""
import contextlib
import os
import secrets

import numpy

from minichain import backend
from minichain.serializers.base import Deserializer, Serializer

__all__ = ['DictionarySerializer', 'NpzDeserializer', 'save_npz', 'load_npz',
           'atomic_write']

_SCALAR_TYPES = (bool, int, float, str, numpy.generic)


def _host_copy(key, value):
    """``value`` as a host ndarray of its own (None stays None)."""
    if value is None:
        return None
    if backend.is_array(value):
        array = backend.to_cpu(value)
        array = numpy.array(array, copy=True) if array is value else array
    elif isinstance(value, _SCALAR_TYPES):
        array = numpy.asarray(value)
    else:
        raise TypeError('DictionarySerializer: {!r} has a value of type {}; '
                        'only arrays, numbers, bools and strings can be '
                        'stored'.format(key, type(value).__name__))
    if array.dtype.kind not in 'biufcUS':
        raise TypeError('DictionarySerializer: {!r} has dtype {}, which an '
                        'npz file cannot hold without pickle'.format(
                            key, array.dtype))
    return array


class DictionarySerializer(Serializer):
    """Saves an object tree into a flat dict ``{'a/b/W': ndarray}``.

    Arrays are copied to the host (the dict is a snapshot, unaffected by
    later training); scalars become 0-d arrays; None values are skipped.

    Args:
        target: the dict to fill (a new one if None).
        path: prefix of every key written through this serializer.

    Attributes:
        target: the dict.
    """

    def __init__(self, target=None, path=''):
        self.target = {} if target is None else target
        self.path = path

    def __getitem__(self, key):
        return DictionarySerializer(self.target,
                                    self.path + key.strip('/') + '/')

    def __call__(self, key, value):
        full = self.path + key.lstrip('/')
        array = _host_copy(full, value)
        if array is not None:
            if full in self.target:
                raise ValueError('DictionarySerializer: key {!r} is written '
                                 'twice'.format(full))
            self.target[full] = array
        return value


class NpzDeserializer(Deserializer):
    """Loads an object tree from an npz file (or any mapping of arrays).

    ``s(key, value)``: an array ``value`` receives the stored array in place
    (same shape; a same-kind dtype cast, e.g. float64 into float32, is
    allowed); a None ``value`` gets the stored array; a scalar ``value``
    gets the stored 0-d value converted to its type.

    Args:
        npz: an opened ``numpy.lib.npyio.NpzFile`` or a dict.
        path: key prefix (``'updater/model:main/'`` loads a model out of a
            trainer snapshot).
        strict: if True, a key the object asks for and the file lacks raises
            ``KeyError``; if False it leaves the value as it is. A missing
            key for a None value is never an error: None values are not
            saved.
        file_name: named in error messages.
    """

    def __init__(self, npz, path='', strict=True, file_name=None, _used=None):
        self.npz = npz
        self.path = path
        self.strict = strict
        self.file_name = file_name or '<npz>'
        self._used = set() if _used is None else _used

    def __getitem__(self, key):
        return NpzDeserializer(self.npz, self.path + key.strip('/') + '/',
                               self.strict, self.file_name, self._used)

    def children(self):
        """Sorted names of the children stored under ``path``."""
        n = len(self.path)
        return sorted({k[n:].split('/', 1)[0] for k in self.npz
                       if k.startswith(self.path) and '/' in k[n:]})

    def skip(self):
        """Count every key under ``path`` as read: ``unused_keys`` (and
        ``load_npz``'s strict check) leave them out."""
        self._used.update(k for k in self.npz if k.startswith(self.path))

    def unused_keys(self):
        """Sorted keys under ``path`` that no ``s(key, value)`` call read."""
        return sorted(k for k in self.npz
                      if k.startswith(self.path) and k not in self._used)

    def __call__(self, key, value):
        full = self.path + key.lstrip('/')
        if full not in self.npz:
            if value is None or not self.strict:
                return value
            raise KeyError('load_npz: key {!r} is not in {}'.format(
                full, self.file_name))
        self._used.add(full)
        stored = self.npz[full]
        if value is None:
            return stored
        if backend.is_array(value):
            return self._copy_into(full, value, stored)
        if isinstance(value, _SCALAR_TYPES):
            if stored.ndim != 0:
                raise ValueError('load_npz: key {!r} in {} holds an array of '
                                 'shape {}, but the target is a scalar {!r}'
                                 .format(full, self.file_name, stored.shape,
                                         value))
            if isinstance(value, numpy.generic):
                return value.dtype.type(stored[()])
            return type(value)(stored.item())
        raise TypeError('load_npz: cannot load key {!r} into a value of type '
                        '{}'.format(full, type(value).__name__))

    def _copy_into(self, key, value, stored):
        if value.shape != stored.shape:
            raise ValueError('load_npz: key {!r} in {} has shape {}, but the '
                             'target has shape {}'.format(
                                 key, self.file_name, stored.shape,
                                 value.shape))
        if not numpy.can_cast(stored.dtype, value.dtype, 'same_kind'):
            raise ValueError('load_npz: key {!r} in {} has dtype {}, which '
                             'cannot be cast to the target dtype {}'.format(
                                 key, self.file_name, stored.dtype,
                                 value.dtype))
        device_id = backend.get_device_id(value)
        if device_id < 0:
            numpy.copyto(value, stored, casting='same_kind')
        else:
            with backend.cuda_device(device_id):
                value[...] = backend.to_gpu(stored.astype(value.dtype),
                                            device_id)
        return value


@contextlib.contextmanager
def atomic_write(path, mode='wb'):
    """Open a temporary file next to ``path``; on success make it ``path``.

    The data is flushed and fsync'ed, then ``os.replace`` renames the file
    over ``path`` in one step, so readers see the old file or the complete
    new one, never a partial write. If the block raises, the temporary file
    is removed and ``path`` is untouched.

    Args:
        path: the destination file.
        mode: ``'wb'`` or ``'w'`` (text, UTF-8).

    Yields:
        the open temporary file.
    """
    path = os.fspath(path)
    directory, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, '.{}.{}.{}.tmp'.format(
        base, os.getpid(), secrets.token_hex(4)))
    # os.open with 0o666 lets the umask set the permissions, as open() does.
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:  # name the file asked for, not the hidden temporary
        raise type(e)(e.errno, e.strerror, path) from None
    try:
        encoding = None if 'b' in mode else 'utf-8'
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def save_npz(file, obj, compression=True):
    """Save ``obj`` (a link, an optimizer, or anything with ``serialize``)
    to an npz file.

    The whole object is serialized into memory first, then written through
    ``atomic_write``: an error or an interruption leaves any previous file
    intact and no temporary file behind.

    Args:
        file: a path, or an open binary file (then written directly).
        obj: the object to save; a dict of arrays (an object serialized
            already, as a snapshot writer gets it) is saved as it is.
        compression: use ``numpy.savez_compressed`` (zip deflate).
    """
    serializer = DictionarySerializer(obj if isinstance(obj, dict) else None)
    if not isinstance(obj, dict):
        serializer.save(obj)
    savez = numpy.savez_compressed if compression else numpy.savez
    if isinstance(file, (str, os.PathLike)):
        with atomic_write(file) as f:
            savez(f, **serializer.target)
    else:
        savez(file, **serializer.target)


def load_npz(file, obj, path='', strict=True):
    """Load ``obj`` from an npz file written by ``save_npz``.

    Args:
        file: a path or an open binary file.
        obj: the object to fill (``obj.serialize`` is called with an
            ``NpzDeserializer``); arrays are filled in place.
        path: key prefix to read under, e.g. ``'updater/model:main/'`` to
            take the model out of a trainer snapshot.
        strict: if True, a key ``obj`` needs that the file lacks raises
            ``KeyError``, and keys under ``path`` that ``obj`` did not read
            raise ``ValueError`` (checked after loading). If False both are
            ignored.

    Raises:
        KeyError: a missing key (named, with the file).
        ValueError: unused keys (listed), or a stored array whose shape or
            dtype does not fit the target (key and both shapes named).
    """
    name = os.fspath(file) if isinstance(file, (str, os.PathLike)) else repr(
        getattr(file, 'name', file))
    npz = numpy.load(file, allow_pickle=False)
    if not isinstance(npz, numpy.lib.npyio.NpzFile):
        raise ValueError('load_npz: {} is a .npy array, not an npz archive'
                         .format(name))
    with npz:
        deserializer = NpzDeserializer(npz, path=path, strict=strict,
                                       file_name=name)
        deserializer.load(obj)
        unused = deserializer.unused_keys() if strict else []
    if unused:
        shown = ', '.join(repr(k) for k in unused[:10])
        more = '' if len(unused) <= 10 else ' and {} more'.format(
            len(unused) - 10)
        raise ValueError('load_npz: {} has keys that {} did not read: {}{} '
                         '(pass strict=False to ignore them)'.format(
                             name, type(obj).__name__, shown, more))
