"""Devices: where arrays live, named the way Chainer names them.

``get_device(spec)`` turns a user's device spec into a Device object:

=====================================  =================
spec                                   device
=====================================  =================
``-1``, ``'@numpy'``, ``'cpu'``         the host (NumPy)
``0``, ``'@cupy:0'``, ``'cuda:0'``      GPU 0 (CuPy)
a Device                               itself
=====================================  =================

A device knows its array module (``xp``), makes itself current (``use()``)
and moves arrays to itself (``send``). GPU devices check for CuPy and a CUDA
device when created, so a missing GPU fails early with backend's message.
"""
import numbers
import os
import sys

import numpy

from minichain import backend

__all__ = ['Device', 'CpuDevice', 'GpuDevice', 'get_device',
           'get_rank_device']


class Device:
    """Base class of devices.

    Attributes:
        xp: ``numpy`` or ``cupy``.
        device_id: -1 on the host, the CUDA device id on a GPU.
        name: the canonical spec string (``'@numpy'``, ``'@cupy:0'``).
    """

    xp = None
    device_id = -1
    name = None

    def use(self):
        """Make this device the current one (a no-op on the host)."""

    def send(self, arrays):
        """Return ``arrays`` (an array, or a list/tuple of them) moved to
        this device; arrays already here are returned as they are."""
        raise NotImplementedError(type(self).__name__ + '.send')

    def __eq__(self, other):
        return isinstance(other, Device) and self.name == other.name

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return '<{} {}>'.format(type(self).__name__, self.name)


class CpuDevice(Device):
    """The host: NumPy arrays."""

    xp = numpy
    device_id = -1
    name = '@numpy'

    def send(self, arrays):
        return backend.to_cpu(arrays)


class GpuDevice(Device):
    """One CUDA device: CuPy arrays.

    Args:
        device_id: the CUDA device id (>= 0).

    Raises:
        RuntimeError: CuPy is missing or no CUDA device answers (from
            ``backend.check_cuda_available``).
    """

    def __init__(self, device_id):
        backend.check_cuda_available()
        self.xp = backend.get_cupy()
        self.device_id = int(device_id)
        self.name = '@cupy:{}'.format(self.device_id)
        visible = visible_gpu_count()
        if self.device_id >= visible:
            raise RuntimeError(
                'get_device: GPU {} asked for, but this process sees {} '
                'GPU(s) (CUDA_VISIBLE_DEVICES={}); a launcher that gives each '
                'rank its own GPU leaves every rank one GPU 0: choose with '
                'minichain.device.get_rank_device(comm.intra_rank, '
                'comm.intra_size)'.format(self.device_id, visible,
                                          _visible_env()))

    def describe(self):
        """``'GPU 0 (NVIDIA H200, PCI 0000:1b:00.0)'``: the id and what it
        is, for messages saying which GPU a process took."""
        runtime = self.xp.cuda.runtime
        try:
            name = runtime.getDeviceProperties(self.device_id)['name']
            name = name.decode() if isinstance(name, bytes) else str(name)
            bus = self.xp.cuda.Device(self.device_id).pci_bus_id
            return 'GPU {} ({}, PCI {})'.format(self.device_id, name, bus)
        except Exception:  # an old CuPy without pci_bus_id
            return 'GPU {}'.format(self.device_id)

    def use(self):
        self.xp.cuda.Device(self.device_id).use()

    def send(self, arrays):
        return backend.to_gpu(arrays, self.device_id)


_SPEC_HELP = ("-1, '@numpy', 'cpu' (host) or a GPU id 0, 1, ..., "
              "'@cupy:N', 'cuda:N'")


def get_device(spec):
    """Return the Device that ``spec`` names.

    Args:
        spec: a Device, an int (negative: host; N >= 0: GPU N), or a string
            ``'@numpy'``, ``'numpy'``, ``'cpu'``, ``'@cupy:N'``, ``'cuda:N'``,
            or an integer written as a string (``'-1'``, ``'0'``).

    Returns:
        a ``CpuDevice`` or ``GpuDevice``.

    Raises:
        TypeError / ValueError: ``spec`` is not one of the forms above.
        RuntimeError: a GPU was asked for and CuPy or CUDA is unavailable.
    """
    if isinstance(spec, Device):
        return spec
    if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
        return CpuDevice() if spec < 0 else GpuDevice(int(spec))
    if not isinstance(spec, str):
        raise TypeError('get_device: expected {}; got {!r} of type {}'.format(
            _SPEC_HELP, spec, type(spec).__name__))
    text = spec.strip().lower()
    if text in ('@numpy', 'numpy', 'cpu'):
        return CpuDevice()
    # Chainer's examples pass ``--device`` straight from argparse: '-1', '0'.
    if text.lstrip('-').isdigit():
        return get_device(int(text))
    for prefix in ('@cupy:', 'cuda:'):
        if text.startswith(prefix):
            number = text[len(prefix):]
            if number.isdigit():
                return GpuDevice(int(number))
    raise ValueError('get_device: unknown device spec {!r}; expected {}'
                     .format(spec, _SPEC_HELP))


def _visible_env():
    return os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')


def visible_gpu_count():
    """How many CUDA devices this process sees (0 without CuPy or GPU)."""
    if not backend.gpu_available():
        return 0
    return int(backend.get_cupy().cuda.runtime.getDeviceCount())


def gpu_bus_id(device_id):
    """The PCI bus id of CUDA device ``device_id`` (the same GPU has the
    same one in every process, whatever CUDA_VISIBLE_DEVICES numbers it);
    the ordinal as text where CuPy cannot tell."""
    try:
        return backend.get_cupy().cuda.Device(device_id).pci_bus_id
    except Exception:  # old CuPy
        return str(device_id)


def rank_device_id(intra_rank, intra_size, visible):
    """Which of the ``visible`` GPUs local rank ``intra_rank`` (of
    ``intra_size`` ranks on its node) drives.

    With at least one GPU per rank, rank k takes GPU k. A launcher that
    binds GPUs itself (``CUDA_VISIBLE_DEVICES`` set per rank, as Slurm's
    ``--gpus-per-task`` and many wrappers do) leaves each rank exactly one
    visible GPU, its own, as device 0. With fewer GPUs than ranks, ranks
    share GPUs round robin; NCCL refuses that (``pure_nccl`` says so on
    every rank), the MPI communicators accept it.

    Raises:
        RuntimeError: no GPU is visible, or ``intra_rank`` is out of range.
    """
    if not 0 <= intra_rank < max(intra_size, 1):
        raise RuntimeError('get_rank_device: local rank {} is not in [0, {})'
                           .format(intra_rank, intra_size))
    if visible < 1:
        raise RuntimeError(
            'get_rank_device: no GPU visible to local rank {} '
            '(CUDA_VISIBLE_DEVICES={})'.format(intra_rank, _visible_env()))
    return intra_rank % visible


def get_rank_device(intra_rank, intra_size, report=True):
    """The GPU this rank should drive, made current: see
    :func:`rank_device_id` for the choice.

    Args:
        intra_rank, intra_size: ``comm.intra_rank`` and ``comm.intra_size``.
        report: print one line to stderr saying which GPU this rank took
            and how many it sees.
    Returns:
        a ``GpuDevice``.
    """
    visible = visible_gpu_count()
    if visible == 0:
        backend.check_cuda_available()  # says what is missing
    dev = GpuDevice(rank_device_id(int(intra_rank), int(intra_size), visible))
    dev.use()
    if report:
        print('minichain: local rank {} of {} uses {} of {} visible '
              '(CUDA_VISIBLE_DEVICES={})'.format(
                  intra_rank, intra_size, dev.describe(), visible,
                  _visible_env()), file=sys.stderr, flush=True)
    return dev
