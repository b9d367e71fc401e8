"""The worker side of MultiprocessIterator, and how examples travel.

A worker reads the examples of its share of a batch (``dataset[i]``) and
sends them back over its pipe, in order. The large NumPy arrays of an
example go through shared memory instead of the pipe: the iterator sends
every worker one ``Block`` of shared memory with a region of ``limit`` bytes
per place in a batch, the worker copies the arrays into the example's
region, and the pipe carries only the rest of the
example (labels, small arrays, its tuple/list/dict structure) with an
``_InBlock`` placeholder where each array was. An example whose arrays do
not fit, or any example when there is no block, is pickled whole.

Warnings raised while reading an example are recorded and sent back, so
that the iterator's process shows them (with its own filters and format);
an exception is sent back with its traceback as text.
"""
import contextlib
import mmap
import os
import pickle
import signal
import socket
import tempfile
import threading
import time
import traceback
import warnings

from multiprocessing import reduction

import numpy

ALIGN = 64            # arrays start at multiples of this in a region
MIN_SHARED = 4096     # smaller arrays travel inside the pickle
_PARENT_CHECK = 1.0   # seconds between checks that the iterator's process lives


class _InBlock:
    """Where an array was: ``offset`` bytes into the example's region."""

    def __init__(self, offset, dtype, shape):
        self.offset, self.dtype, self.shape = offset, dtype, shape


class Block:
    """Shared memory for ``slots`` batches of ``batch_size`` regions of
    ``per_example`` bytes: a memfd (an unlinked temporary file where there
    is no memfd), mapped by the iterator and, once sent, by every worker."""

    def __init__(self, slots, batch_size, per_example):
        self.per_example = per_example
        self.stride = batch_size * per_example
        self.size = slots * self.stride
        if hasattr(os, 'memfd_create'):
            self.fd = os.memfd_create('minichain-batches', os.MFD_CLOEXEC)
        else:
            self.fd, path = tempfile.mkstemp(prefix='minichain-batches-')
            os.unlink(path)
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        self.free = list(range(slots))

    def base(self, slot, position):
        return slot * self.stride + position * self.per_example

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        # an array still viewing it raises BufferError; it goes with that
        with contextlib.suppress(BufferError):
            self.map.close()


def _shared(x):
    return (type(x) is numpy.ndarray and not x.dtype.hasobject
            and x.nbytes >= MIN_SHARED)


def _aligned(n):
    return -(-n // ALIGN) * ALIGN


def _walk(x, array_fn, leaf=_shared):
    """``x`` with every shareable array (every ``leaf``) replaced by
    ``array_fn(array)``, through plain tuples, lists and dicts (other
    containers travel whole)."""
    if leaf(x):
        return array_fn(x)
    if type(x) in (tuple, list):
        return type(x)(_walk(v, array_fn, leaf) for v in x)
    if type(x) is dict:
        return {k: _walk(v, array_fn, leaf) for k, v in x.items()}
    return x


def shared_bytes(example):
    """Bytes the shareable arrays of ``example`` take in a region."""
    sizes = []
    _walk(example, lambda a: sizes.append(_aligned(a.nbytes)))
    return sum(sizes)


def pack(example, block, base):
    """Copy ``example``'s shareable arrays into ``block`` from byte ``base``
    on; return the example with ``_InBlock`` placeholders."""
    used = [0]

    def put(a):
        offset = used[0]
        numpy.copyto(numpy.ndarray(a.shape, a.dtype, block, base + offset), a)
        used[0] += _aligned(a.nbytes)
        return _InBlock(offset, a.dtype, a.shape)
    return _walk(example, put)


def unpack(skeleton, block, base):
    """The example ``pack`` described, with fresh arrays copied out of the
    block (the region is reused by a later batch)."""
    def copy_out(s):
        return numpy.ndarray(s.shape, s.dtype, block, base + s.offset).copy()
    return _walk(skeleton, copy_out, lambda s: type(s) is _InBlock)


def describe(error):
    """``(pickled exception or None, type name, one-line message,
    traceback text)`` of an exception, for the iterator's process."""
    try:
        data = pickle.dumps(error, pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
    except Exception:  # noqa: BLE001 (any exception may fail to travel)
        data = None
    text = ''.join(traceback.format_exception(type(error), error,
                                              error.__traceback__))
    return data, type(error).__name__, ' '.join(str(error).split()), text


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker (as text)."""

    def __str__(self):
        return '\n' + self.args[0]


def rebuild_error(name, index, number, error):
    """The exception ``describe`` sent from worker ``number`` for example
    ``index``, for the iterator called ``name`` to raise: the same type
    when it takes one message, else RuntimeError; one line naming the
    iterator and the index; the worker's traceback as its cause."""
    data, type_name, message, text = error
    message = '{}: example {} of the dataset (worker {}): {}'.format(
        name, index, number, message)
    exc = None
    if data is not None:
        try:
            exc = type(pickle.loads(data))(message)
        except Exception:  # noqa: BLE001 (a type that wants more arguments)
            exc = None
    if exc is None:
        exc = RuntimeError('{} ({})'.format(message, type_name))
    exc.__cause__ = RemoteTraceback(text)
    return exc


def _travel(example, block, base, limit):
    """``('s', pickled skeleton)`` when the arrays fit the region, else
    ``('p', bytes the arrays need, pickled example)``."""
    need = shared_bytes(example)
    if block is not None and base is not None and need <= limit:
        return 's', pickle.dumps(pack(example, block, base),
                                 pickle.HIGHEST_PROTOCOL)
    return 'p', need, pickle.dumps(example, pickle.HIGHEST_PROTOCOL)


def _category(w):
    try:
        pickle.dumps(w.category)
        return w.category
    except Exception:  # noqa: BLE001 (a category defined in a closure)
        return UserWarning


def read_share(dataset, task, items, limit, block, progress, number):
    """Read ``items`` (``[(dataset index, region start or None)]``) and
    return the message for the iterator: ``('done', task, examples,
    warnings)`` or ``('error', task, examples, warnings, index, error)``
    with the examples read before the failing one."""
    out, caught = [], []
    for index, base in items:
        progress[number] = index
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter('always')
                example = dataset[index]
            caught += [(_category(w), str(w.message), w.filename, w.lineno)
                       for w in seen]
            out.append(_travel(example, block, base, limit))
        except Exception as e:  # noqa: BLE001 (sent back, raised there)
            progress[number] = -1
            return 'error', task, out, caught, index, describe(e)
    progress[number] = -1
    return 'done', task, out, caught


def _watch(conn):
    """Leave at once when the iterator's end of the pipe closes, also while
    the dataset is busy (a stuck decoder, a long read): the iterator's
    process was killed, or it is stopping."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        while True:
            time.sleep(_PARENT_CHECK)
            try:
                if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b'':
                    os._exit(0)
            except BlockingIOError:  # open, nothing to read
                pass
            except OSError:
                os._exit(0)


def run(dataset, conn, progress, number, close):
    """A worker's life: read shares of batches until the iterator says stop
    (None), closes its end of the pipe, or its process is gone.

    ``dataset`` is pickled bytes (forkserver, spawn) or the object (fork);
    ``close`` lists inherited connections of other workers (fork only),
    closed so that they do not keep other workers' pipes open.
    SIGINT and SIGTERM are ignored: a Ctrl-C or a batch system's SIGTERM
    reaches the whole process group, and the iterator's process decides
    (it stops its workers when it ends). A thread watches the pipe, so
    that the worker leaves within a second of the iterator's process,
    whatever the dataset is doing.
    """
    for other in close:
        if other is not conn and not other.closed:
            other.close()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    if isinstance(dataset, bytes):
        dataset = pickle.loads(dataset)
    threading.Thread(target=_watch, args=(conn,), daemon=True).start()
    block, limit = None, 0
    while True:
        try:
            message = conn.recv()
            if message is None:
                return
            if message[0] == 'block':
                _, size, limit = message
                fd = reduction.recv_handle(conn)
                block = mmap.mmap(fd, size)
                os.close(fd)
                continue
            _, task, items = message
            conn.send(read_share(dataset, task, items, limit, block,
                                 progress, number))
        except (EOFError, OSError):  # the iterator's process is gone
            return
