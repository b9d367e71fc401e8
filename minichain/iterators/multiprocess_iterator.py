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

Shutdown and dead workers: see ``_worker_pool``.
"""
import collections
import copy
import mmap
import multiprocessing
import numbers
import os
import pickle
import time
import warnings

from minichain.dataset.iterator import Iterator
from minichain.iterators import _multiprocess_worker as _worker
from minichain.iterators import _worker_pool
from minichain.iterators.serial_iterator import SerialIterator, _random_seed
from minichain.serializers.base import Deserializer

__all__ = ['MultiprocessIterator', 'TimeoutWarning']

_NAME = 'MultiprocessIterator'


class TimeoutWarning(RuntimeWarning):
    """A batch has waited for its examples longer than ``dataset_timeout``."""


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


def _shown(name, doc):
    """A read-only attribute of the SerialIterator of batches handed out."""
    return property(lambda self: getattr(self._shown, name), doc=doc)


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
        self._pool = None       # the workers, from the first batch on
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

    # -- SerialIterator's state, of the batches handed out --------------------
    repeat = _shown('repeat', 'Whether the iterator loops forever.')
    shuffle = _shown('shuffle', 'Whether each epoch is shuffled.')
    seed = _shown('seed', 'The shuffling seed.')
    epoch = _shown('epoch', 'Number of completed epochs.')
    is_new_epoch = _shown('is_new_epoch', 'True just after the batch that '
                          'completed an epoch.')
    current_position = _shown('current_position', 'Position in the epoch.')
    epoch_detail = _shown('epoch_detail', '``epoch + position / len``.')
    previous_epoch_detail = _shown('previous_epoch_detail', '``epoch_detail``'
                                   ' before the last batch (None before the '
                                   'first).')

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
        try:
            batch = self._wait_first()
            examples = [] if batch.error else [
                self._unpack(batch, position, item)
                for position, item in enumerate(batch.examples)]
            self._release(batch)
            self._shown.__next__()
            self._at_start = False
            self._fill()  # the workers read on while the caller steps
        except BaseException as e:
            # A dead worker, or Ctrl-C in the middle of a message: the pipes
            # cannot be trusted. Stop the workers; the position is kept.
            if isinstance(e, _worker_pool.WorkerDied):
                self._broken = str(e)
            self.finalize()
            raise
        for category, message, filename, lineno in batch.warnings:
            warnings.warn_explicit(message, category, filename, lineno,
                                   registry=self._registry)
        if batch.error:
            raise _worker.rebuild_error(_NAME, *batch.error)
        return examples

    def _wait_first(self):
        """The oldest batch out, once all its shares are in."""
        if self._pool is None:
            self._pool = _worker_pool.Pool(_NAME, self.dataset,
                                           self.n_processes, self.start_method)
            self._turn = 0
            if self._per_example:  # shared_mem, or the size found before
                self._new_block(self._per_example)
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
        return self._inflight.popleft()

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
            n = min(len(self._pool), len(indices))
            bounds = [len(indices) * j // n for j in range(n + 1)]
            for j in range(n):
                positions = range(bounds[j], bounds[j + 1])
                items = [(int(indices[p]), None if block is None
                          else block.base(batch.slot, p)) for p in positions]
                task, self._next_task = self._next_task, self._next_task + 1
                number = (self._turn + j) % len(self._pool)
                self._pool.send(number, ('task', task, items))
                self._tasks[task] = (batch, positions, number)
                batch.pending.add(task)
            self._turn = (self._turn + n) % len(self._pool)

    def _receive(self, timeout):
        """Take in the shares that arrive within ``timeout`` seconds (None:
        wait for one); whether any did."""
        ready = self._pool.receive(timeout)
        for number, message in ready:
            self._take(number, message)
        return bool(ready)

    def _warn_slow(self, batch):
        reading = sorted({self._pool.reading(self._tasks[t][2])
                          for t in batch.pending} - {-1})
        warnings.warn('{}: a batch has waited more than {} s for its '
                      'examples; the workers are reading example(s) {} (a '
                      'slow or hung dataset?)'.format(
                          _NAME, self.dataset_timeout,
                          ', '.join(map(str, reading)) or '(none yet)'),
                      TimeoutWarning)

    def _take(self, number, message):
        kind, task, examples, caught = message[:4]
        batch, positions, _ = self._tasks.pop(task)
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
        self._pool.send_block(self._block)

    def finalize(self):
        """Stop and reap the workers and free the shared memory. The
        position is kept: a later ``next()`` starts new workers."""
        if self._pool is not None:
            self._pool.stop()
            self._pool = None
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
