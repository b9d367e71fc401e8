"""MultiprocessIterator: batches read by worker processes while the step runs.

The order of examples is SerialIterator's, computed here in the training
process: a SerialIterator over ``range(len(dataset))`` plans the batches
ahead, and a second one advances only when a batch is returned, so that
``epoch``, ``is_new_epoch``, ``epoch_detail`` and the snapshot state always
describe the batches handed out, never the ones being read ahead. Batches
and snapshots are therefore the same as SerialIterator's for the same seed,
and a snapshot of one kind of iterator resumes the other.

Each batch is cut into one contiguous share per worker; up to ``n_prefetch``
batches are out at a time, and each worker reads its shares in order. The
arrays come back through one block of shared memory (see
``_multiprocess_worker``), which is a memfd: it needs no name, so nothing is
left in /dev/shm when processes are killed, and it is not limited by the
size of /dev/shm (64 MiB in a default Docker container).

Start method: ``'forkserver'`` by default (``'spawn'`` where there is no
forkserver). Forking the training process itself copies everything it
holds: an initialized MPI library (with InfiniBand, pages registered with
the network card and then shared copy-on-write can corrupt the parent's
transfers, which is why Open MPI warns about fork and ChainerMN's ImageNet
example switches to forkserver), a CUDA context (unusable in the child),
and the threads of minichain's CPU pools, of the BLAS and of MPI, any of
which may hold a lock at the moment of the fork that then stays locked in
the child. A forkserver is started by fork + exec (a fresh interpreter, as
every MPI allows), holds none of these, and forks the workers from itself.
The price: the dataset is pickled to each worker (once, at start), so it
must be picklable (module-level functions or ``functools.partial`` in place
of lambdas). ``start_method='fork'`` remains for datasets that cannot be
pickled, in programs that use neither MPI nor a GPU.

Shutdown: ``finalize()`` (also at the end of ``Trainer.run``, on ``with``
exit, on garbage collection and at interpreter exit) asks every worker to
stop, then kills those still busy after a second, and waits for all, so
no process is left behind. Workers ignore SIGINT and SIGTERM (a Ctrl-C or a
batch system signals the whole process group; the training process decides
what to do), and leave by themselves when the training process is gone
(their pipe closes), also after a SIGKILL.
"""
import atexit
import collections
import copy
import mmap
import multiprocessing
import multiprocessing.connection
import multiprocessing.util  # noqa: F401 (its atexit hook must come first)
import numbers
import os
import pickle
import signal
import time
import warnings
import weakref

from minichain.dataset.iterator import Iterator
from minichain.iterators import _multiprocess_worker as _worker
from minichain.iterators.serial_iterator import SerialIterator, _random_seed
from minichain.serializers.base import Deserializer

__all__ = ['MultiprocessIterator', 'TimeoutWarning']

_NAME = 'MultiprocessIterator'
_GRACE = 1.0  # seconds a stopping worker may finish its share
_live = weakref.WeakSet()
_atexit = {'registered': False}


class TimeoutWarning(RuntimeWarning):
    """A batch has waited for its examples longer than ``dataset_timeout``."""


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker (as text)."""

    def __str__(self):
        return '\n' + self.args[0]


def _check_int(name, value, minimum):
    if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
            or value < minimum):
        raise ValueError('{}: {} must be an int >= {}, got {!r}'.format(
            _NAME, name, minimum, value))
    return int(value)


def _default_processes():
    return len(os.sched_getaffinity(0)) if hasattr(
        os, 'sched_getaffinity') else (os.cpu_count() or 1)


class _Batch:
    """A batch being read: its indices, its slot in a block, the shares
    still out, what came back."""

    def __init__(self, indices, block, slot):
        self.indices, self.block, self.slot = indices, block, slot
        self.examples = [None] * len(indices)
        self.pending, self.warnings = set(), []
        self.error, self.stale = None, False


def _stop(workers):
    """Ask ``workers`` (``[(process, conn)]``) to stop, kill the ones still
    running after the grace period, and reap them all."""
    for _, conn in workers:
        try:
            conn.send(None)
        except OSError:
            pass
        conn.close()
    deadline = time.monotonic() + _GRACE
    for process, _ in workers:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join()
    workers.clear()


def _stop_all():
    for it in list(_live):
        it.finalize()


class MultiprocessIterator(Iterator):
    """SerialIterator's batches, read by ``n_processes`` worker processes.

    Workers start at the first batch and read up to ``n_prefetch`` batches
    ahead while the training step runs; ``dataset[i]`` runs in a worker, so
    decoding and augmentation in the dataset leave the training process
    free. Batches, epochs and snapshots are exactly SerialIterator's for the
    same arguments and seed (the order comes from the same code), provided
    ``dataset[i]`` depends on ``i`` alone: randomness inside the dataset
    must be seeded from the index (random crops in a converter, as in
    models/train_data.py, stay in the training process).

    An exception raised by the dataset is raised by ``next()`` with the
    same type, naming the iterator and the example index (the worker's
    traceback is chained); a worker that dies (out of memory, a crash in a
    decoder) raises RuntimeError naming it and the example it was reading;
    warnings from the dataset are shown in the training process.

    Args:
        dataset: the dataset (``len`` and integer indexing); pickled to
            each worker unless ``start_method='fork'``.
        batch_size: examples per batch (positive int).
        repeat: loop over the dataset forever.
        shuffle: shuffle every epoch (None means True, as in Chainer).
        n_processes: worker processes (default: one per usable core).
        n_prefetch: batches read ahead of the one returned (at least 1).
        shared_mem: bytes of shared memory per example; None sizes it from
            the first batch (and grows it when a larger example comes);
            0 sends everything through pipes. An example larger than an
            explicit size goes through its pipe, with a warning.
        seed: the shuffling seed (see SerialIterator).
        dataset_timeout: seconds a batch may wait for its examples before a
            ``TimeoutWarning`` says which ones are still being read (None:
            never).
        start_method: ``'forkserver'`` (default where available),
            ``'spawn'`` or ``'fork'``; see the module docstring.
    """

    TimeoutWarning = TimeoutWarning

    def __init__(self, dataset, batch_size, repeat=True, shuffle=None,
                 n_processes=None, n_prefetch=1, shared_mem=None, seed=None,
                 dataset_timeout=30.0, start_method=None):
        self.batch_size = _check_int('batch_size', batch_size, 1)
        self.n_processes = _check_int('n_processes', _default_processes()
                                      if n_processes is None else
                                      n_processes, 1)
        self.n_prefetch = _check_int('n_prefetch', n_prefetch, 1)
        if shared_mem is not None:
            shared_mem = _check_int('shared_mem', shared_mem, 0)
        self.shared_mem = shared_mem
        if dataset_timeout is not None and not dataset_timeout > 0:
            raise ValueError('{}: dataset_timeout must be positive or None, '
                             'got {!r}'.format(_NAME, dataset_timeout))
        self.dataset_timeout = dataset_timeout
        methods = multiprocessing.get_all_start_methods()
        if start_method is None:
            start_method = 'forkserver' if 'forkserver' in methods \
                else 'spawn'
        if start_method not in methods:
            raise ValueError('{}: start_method must be one of {}, got {!r}'
                             .format(_NAME, ', '.join(methods), start_method))
        self.start_method = start_method
        self.dataset = dataset
        seed = _random_seed() if seed is None else int(seed)
        self._shown = SerialIterator(range(len(dataset)), self.batch_size,
                                     repeat, shuffle, seed)
        self._workers = []      # [(process, conn)]; empty until first batch
        self._inflight = collections.deque()   # live batches, oldest first
        self._stale = []        # dropped batches whose shares are still out
        self._tasks = {}        # task id -> (batch, positions)
        self._next_task = self._turn = 0
        self._block, self._per_example = None, shared_mem or 0
        self._grow = 0          # bytes per example a new block needs
        self._broken = None
        self._warned_size = False
        self._registry = {}     # for warnings relayed from the workers
        self._at_start = True
        self._restart_plan()
        self._finalizer = weakref.finalize(self, _stop, self._workers)

    # -- SerialIterator's state, of the batches handed out --------------------
    repeat = property(lambda self: self._shown.repeat,
                      doc='Whether the iterator loops forever.')
    shuffle = property(lambda self: self._shown.shuffle,
                       doc='Whether each epoch is shuffled.')
    seed = property(lambda self: self._shown.seed, doc='The shuffling seed.')
    epoch = property(lambda self: self._shown.epoch,
                     doc='Number of completed epochs.')
    is_new_epoch = property(lambda self: self._shown.is_new_epoch,
                            doc='True just after the batch that completed an '
                            'epoch.')
    current_position = property(lambda self: self._shown.current_position,
                                doc='Position inside the current epoch.')
    epoch_detail = property(lambda self: self._shown.epoch_detail,
                            doc='``epoch + position / len``.')
    previous_epoch_detail = property(
        lambda self: self._shown.previous_epoch_detail,
        doc='``epoch_detail`` before the last batch (None before the first).')

    def reset(self):
        """Go back to the start of epoch 0 (batches already read ahead for
        epoch 0 are kept when nothing was handed out since)."""
        if self._at_start:
            return
        self._shown.reset()
        self._at_start = True
        self._restart_plan()

    def serialize(self, serializer):
        """Save or load SerialIterator's keys; loading drops the batches
        read ahead (they belong to the old position)."""
        self._shown.serialize(serializer)
        if isinstance(serializer, Deserializer):
            self._at_start = False
            self._restart_plan()

    def _restart_plan(self):
        # The plan shares the order array: SerialIterator replaces it at
        # each epoch and changes it in place only when loading, after which
        # the plan is copied again.
        self._plan = copy.copy(self._shown)
        self._plan_done = False
        while self._inflight:
            self._drop(self._inflight.popleft())

    def _drop(self, batch):
        """Forget a live batch; its slot is free once its shares are in."""
        batch.stale = True
        if batch.pending:
            self._stale.append(batch)
        else:
            self._release(batch)

    def _release(self, batch):
        if batch.block is not None and batch.block is self._block:
            self._block.free.append(batch.slot)
        batch.block = None

    # -- batches ---------------------------------------------------------------
    def __next__(self):
        if self._broken:
            raise RuntimeError(self._broken)
        if len(self.dataset) == 0:
            raise ValueError('{}: the dataset is empty'.format(_NAME))
        if not self._shown.repeat and self._shown.epoch > 0:
            raise StopIteration
        if not self._workers:
            self._start()
        self._fill()
        batch = self._inflight[0]
        started, warned = time.monotonic(), False
        while batch.pending:
            timeout = None
            if self.dataset_timeout is not None and not warned:
                timeout = max(0.0, started + self.dataset_timeout
                              - time.monotonic())
            if not self._receive(timeout) and timeout is not None:
                warned = True
                self._warn_slow(batch)
        self._inflight.popleft()
        examples = [] if batch.error else [
            self._unpack(batch, position, item)
            for position, item in enumerate(batch.examples)]
        self._release(batch)
        self._shown.__next__()
        self._at_start = False
        for category, message, filename, lineno in batch.warnings:
            warnings.warn_explicit(message, category, filename, lineno,
                                   registry=self._registry)
        self._fill()
        if batch.error:
            self._raise(*batch.error)
        return examples

    def _unpack(self, batch, position, item):
        if item[0] == 'p':
            return pickle.loads(item[2])
        return _worker.unpack(pickle.loads(item[1]), batch.block.map,
                              batch.block.base(batch.slot, position))

    def _fill(self):
        """Send out batches until ``n_prefetch`` are being read."""
        while len(self._inflight) < self.n_prefetch and not self._plan_done:
            if self._grow:  # room for the largest example and a quarter
                self._new_block(self._grow + self._grow // 4)
            block = self._block
            while block is not None and not block.free:
                self._receive(None)  # a dropped batch still holds a slot
            try:
                indices = self._plan.__next__()
            except StopIteration:
                self._plan_done = True
                return
            batch = _Batch(indices, block,
                           None if block is None else block.free.pop())
            self._inflight.append(batch)
            n = min(len(self._workers), len(indices))
            bounds = [len(indices) * j // n for j in range(n + 1)]
            for j in range(n):
                positions = range(bounds[j], bounds[j + 1])
                items = [(int(indices[p]), None if block is None
                          else block.base(batch.slot, p)) for p in positions]
                task, self._next_task = self._next_task, self._next_task + 1
                number = (self._turn + j) % len(self._workers)
                try:
                    self._workers[number][1].send(('task', task, items))
                except OSError:
                    self._died(number)
                self._tasks[task] = (batch, positions, number)
                batch.pending.add(task)
            self._turn = (self._turn + n) % len(self._workers)

    def _receive(self, timeout):
        """Take in the shares that arrive within ``timeout`` seconds (None:
        wait for one); whether any did."""
        conns = {conn: number for number, (_, conn)
                 in enumerate(self._workers)}
        ready = multiprocessing.connection.wait(list(conns), timeout)
        for conn in ready:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                self._died(conns[conn])
            self._take(message)
        return bool(ready)

    def _take(self, message):
        kind, task, examples, caught = message[:4]
        batch, positions, number = self._tasks.pop(task)
        batch.pending.discard(task)
        for position, item in zip(positions, examples):
            batch.examples[position] = item
            if item[0] == 'p' and item[1] > self._per_example:
                self._too_large(item[1])
        batch.warnings += caught
        if kind == 'error' and batch.error is None:
            batch.error = (message[4], number, message[5])
        if batch.stale and not batch.pending:
            self._stale.remove(batch)
            self._release(batch)

    def _too_large(self, need):
        if self.shared_mem is None:
            self._grow = max(self._grow, need)
        elif self.shared_mem and not self._warned_size:
            self._warned_size = True
            warnings.warn('{}: an example needs {} bytes of shared memory, '
                          'more than shared_mem={}; such examples go through '
                          'a pipe (slower). Pass shared_mem={} or more, or '
                          'None to size it automatically'.format(
                              _NAME, need, self.shared_mem, need))

    def _new_block(self, per_example):
        """A block with ``per_example`` bytes (rounded up to pages) for each
        example, sent to every worker; batches in the old one keep it."""
        self._grow = 0
        per_example = -(-per_example // mmap.PAGESIZE) * mmap.PAGESIZE
        self._per_example = per_example
        self._block = _worker.Block(self.n_prefetch, self.batch_size,
                                    per_example)
        for number, (process, conn) in enumerate(self._workers):
            try:
                conn.send(('block', self._block.size, per_example))
                multiprocessing.reduction.send_handle(conn, self._block.fd,
                                                      process.pid)
            except OSError:
                self._died(number)
        os.close(self._block.fd)  # each worker has received its own copy
        self._block.fd = None

    # -- workers ---------------------------------------------------------------
    def _start(self):
        ctx = multiprocessing.get_context(self.start_method)
        if self.start_method == 'fork':
            dataset = self.dataset
        else:
            try:
                dataset = pickle.dumps(self.dataset, pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001 (whatever pickle raises)
                raise TypeError(
                    "{}: the dataset cannot be sent to the worker processes "
                    "(start_method={!r} pickles it): {}: {}; use module-level "
                    "functions or functools.partial instead of lambdas and "
                    "local classes, or start_method='fork' in a program "
                    "without MPI or a GPU".format(
                        _NAME, self.start_method, type(e).__name__, e)) from e
        if not _atexit['registered']:  # runs before multiprocessing's own
            atexit.register(_stop_all)
            _atexit['registered'] = True
        _live.add(self)
        self._progress = ctx.RawArray('q', self.n_processes)
        pipes = [ctx.Pipe() for _ in range(self.n_processes)]
        inherited = [c for pair in pipes for c in pair] \
            if self.start_method == 'fork' else []
        for number, (mine, theirs) in enumerate(pipes):
            process = ctx.Process(
                target=_worker.run, name='{}-{}'.format(_NAME, number),
                args=(dataset, theirs, self._progress, number, inherited),
                daemon=True)
            process.start()
            theirs.close()
            self._workers.append((process, mine))
        self._turn = 0
        if self._per_example:  # shared_mem, or the size found before
            self._new_block(self._per_example)

    def _died(self, number):
        """A worker's pipe closed: say which and what it was reading,
        stop the others, and raise (every later call raises too)."""
        process = self._workers[number][0]
        process.join(5.0)
        code = process.exitcode
        if code is None:
            how = 'closed its pipe'
        elif code < 0:
            name = signal.Signals(-code).name
            how = 'was killed by {}{}'.format(name, {
                'SIGKILL': ' (out of memory?)',
                'SIGBUS': ' (out of shared memory?)'}.get(name, ''))
        else:
            how = 'exited with status {}'.format(code)
        index = self._progress[number]
        self._broken = '{}: worker {} of {} (pid {}) {} {}'.format(
            _NAME, number, len(self._workers), process.pid, how,
            'while reading example {} of the dataset'.format(index)
            if index >= 0 else 'between examples')
        self.finalize()
        raise RuntimeError(self._broken)

    def _raise(self, index, number, error):
        data, type_name, message, text = error
        message = '{}: example {} of the dataset (worker {}): {}'.format(
            _NAME, index, number, message)
        exc = None
        if data is not None:
            try:
                exc = type(pickle.loads(data))(message)
            except Exception:  # noqa: BLE001 (a type that wants more args)
                exc = None
        if exc is None:
            exc = RuntimeError('{} ({})'.format(message, type_name))
        raise exc from _RemoteTraceback(text)

    def _warn_slow(self, batch):
        reading = sorted({self._progress[self._tasks[t][2]]
                          for t in batch.pending} - {-1})
        warnings.warn('{}: a batch has waited more than {} s for its '
                      'examples; the workers are reading example(s) {} (a '
                      'slow or hung dataset?)'.format(
                          _NAME, self.dataset_timeout,
                          ', '.join(map(str, reading)) or '(none yet)'),
                      TimeoutWarning)

    def finalize(self):
        """Stop and reap the workers and free the shared memory. The
        position is kept: a later ``next()`` starts new workers."""
        _stop(self._workers)
        _live.discard(self)
        self._restart_plan()
        self._stale.clear()
        self._tasks.clear()
        if self._block is not None:
            self._block.close()
            self._block = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()

    def __repr__(self):
        return ('{}(len(dataset)={}, batch_size={}, repeat={}, shuffle={}, '
                'seed={}, n_processes={}, n_prefetch={})'.format(
                    _NAME, len(self.dataset), self.batch_size, self.repeat,
                    self.shuffle, self.seed, self.n_processes,
                    self.n_prefetch))
