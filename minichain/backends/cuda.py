"""Chainer's ``chainer.backends.cuda`` basics, over :mod:`minichain.backend`.

What Chainer's examples use: ``get_device_from_id(args.gpu).use()``,
``to_gpu``, ``to_cpu``, ``get_array_module``, ``check_cuda_available``, and
the names ``cupy``, ``ndarray`` and ``available``. It imports no CuPy of its
own (only ``minichain.backend`` does); ``cupy``, ``ndarray`` and ``available``
are looked up on first use, so importing this module costs nothing.

Without a usable GPU, as in Chainer: ``available`` is False, ``cupy`` is a
placeholder object (``xp is cuda.cupy`` is simply False), ``ndarray`` is a
class that no array is an instance of, ``get_device_from_id`` of None or a
negative id returns ``DummyDevice`` (whose ``use()`` and ``with`` do nothing),
and ``to_gpu`` raises backend's RuntimeError saying what is missing.
"""
from minichain import backend

# available, cupy and ndarray come from __getattr__ below.
__all__ = ['DummyDevice', 'available', 'check_cuda_available',  # noqa: F822
           'cupy', 'get_array_module', 'get_device_from_id', 'ndarray',
           'to_cpu', 'to_gpu']

check_cuda_available = backend.check_cuda_available
get_array_module = backend.get_array_module


class DummyDeviceType:
    """The host as a CUDA-device-like object: ``use()`` and ``with`` do
    nothing, its id is -1."""

    id = -1

    def __int__(self):
        return -1

    def __enter__(self):
        return self

    def __exit__(self, *args):
        return None

    def use(self):
        """Nothing to make current on the host."""

    def synchronize(self):
        """Nothing to wait for on the host."""

    def __eq__(self, other):
        return isinstance(other, DummyDeviceType)

    def __hash__(self):
        return hash(DummyDeviceType)

    def __repr__(self):
        return 'DummyDevice'


DummyDevice = DummyDeviceType()


class _NoCupy:
    """``cuda.cupy`` without a usable CuPy: compares unequal to every module,
    and any attribute says why there is none."""

    def __getattr__(self, name):
        if name.startswith('__'):
            raise AttributeError(name)
        backend.check_cuda_available()  # raises, naming what is missing
        raise AttributeError(name)

    def __repr__(self):
        return '<minichain.cuda.cupy: CuPy is not usable here>'


class _NoNdarray:
    """``cuda.ndarray`` without CuPy: no array is an instance of it."""

    def __init__(self, *args, **kwargs):
        backend.check_cuda_available()


_NO_CUPY = _NoCupy()


def _cupy_or_none():
    if not backend.gpu_available():
        return None
    return backend.get_cupy()


def __getattr__(name):
    # Resolved on use: asking whether a GPU answers may load CuPy.
    if name == 'available':
        return backend.gpu_available()
    if name == 'cupy':
        return _cupy_or_none() or _NO_CUPY
    if name == 'ndarray':
        cp = _cupy_or_none()
        return _NoNdarray if cp is None else cp.ndarray
    raise AttributeError('module minichain.backends.cuda has no attribute {!r}'
                         .format(name))


def get_device_from_id(device_id):
    """The CUDA device ``device_id`` (a ``cupy.cuda.Device``: ``use()`` makes
    it current, ``with`` makes it current for a block), or ``DummyDevice``
    for None or a negative id (the host), as in Chainer.

    Raises:
        RuntimeError: a GPU id was given and CuPy or CUDA is unavailable.
    """
    if device_id is None or int(device_id) < 0:
        return DummyDevice
    return backend.cuda_device(int(device_id))


def _device_id(device):
    """An int id (None: the current device) from Chainer's device forms."""
    if device is None or device is DummyDevice:
        return None
    for attr in ('device_id', 'id'):  # minichain's GpuDevice, cupy's Device
        value = getattr(device, attr, None)
        if value is not None:
            return int(value)
    return int(device)


def to_gpu(array, device=None):
    """Copy ``array`` (or a list/tuple of arrays; None passes) to a GPU:
    ``device`` is an id, a ``cupy.cuda.Device``, a minichain ``GpuDevice``,
    or None / ``DummyDevice`` for the current one. Arrays already there are
    returned as they are.

    Raises:
        RuntimeError: CuPy or CUDA is unavailable (says which).
    """
    return backend.to_gpu(array, _device_id(device))


def to_cpu(array):
    """``array`` (or a list/tuple of arrays; None passes) as NumPy arrays
    (a copy only for GPU arrays)."""
    return backend.to_cpu(array)
