"""The worker processes of a MultiprocessIterator, seen from its process.

A ``Pool`` starts them, sends them work and shared-memory blocks, takes in
what they send back, notices when one dies, and stops them.

Shutdown: ``stop()`` (the iterator's ``finalize()``, also at the end of
``Trainer.run``, on ``with`` exit, when the pool is garbage collected and
at interpreter exit) asks every worker to stop, kills those still busy
after a second, and reaps them all, so that no process is left behind.
Workers ignore SIGINT and SIGTERM (a Ctrl-C or a batch system signals the
whole process group; the training process decides what to do) and leave by
themselves within a second once the training process is gone, whatever
killed it (their pipe closes; see ``_multiprocess_worker.run``).
"""
import atexit
import contextlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.reduction
import multiprocessing.util  # noqa: F401 (its atexit hook must come first)
import os
import pickle
import signal
import time
import weakref

from minichain.iterators import _multiprocess_worker as _worker

_GRACE = 1.0  # seconds a stopping worker may finish its share
_live = weakref.WeakSet()
_atexit = {'registered': False}


class WorkerDied(RuntimeError):
    """A worker process ended while the iterator still needed it."""


def _stop(procs):
    """Ask ``procs`` (``[(process, conn)]``) to stop, kill the ones still
    running after the grace period, and reap them all."""
    for _, conn in procs:
        with contextlib.suppress(OSError):
            conn.send(None)
        conn.close()
    deadline = time.monotonic() + _GRACE
    for process, _ in procs:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join()
    procs.clear()


def _stop_all():
    for pool in list(_live):
        pool.stop()


class Pool:
    """``n`` worker processes reading ``dataset`` for the iterator called
    ``name``, started with ``start_method``.

    Raises TypeError when the dataset cannot be pickled (all methods but
    fork), RuntimeError when a process does not start.
    """

    def __init__(self, name, dataset, n, start_method):
        self.name = name
        ctx = multiprocessing.get_context(start_method)
        if start_method != 'fork':
            try:
                dataset = pickle.dumps(dataset, pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001 (whatever pickle raises)
                raise TypeError(
                    "{}: the dataset cannot be sent to the worker processes "
                    "(start_method={!r} pickles it): {}: {}; use module-level "
                    "functions or functools.partial instead of lambdas and "
                    "local classes, or start_method='fork' in a program "
                    "without MPI or a GPU".format(
                        name, start_method, type(e).__name__, e)) from e
        if not _atexit['registered']:  # so it runs before multiprocessing's
            atexit.register(_stop_all)
            _atexit['registered'] = True
        self._procs = []
        weakref.finalize(self, _stop, self._procs)
        _live.add(self)
        self._progress = ctx.RawArray('q', n)  # the index each one reads
        self._progress[:] = [-1] * n  # none yet: a worker may die starting
        self._answered = set()
        pipes = [ctx.Pipe() for _ in range(n)]
        inherited = [c for pair in pipes for c in pair] \
            if start_method == 'fork' else []
        for number, (mine, theirs) in enumerate(pipes):
            process = ctx.Process(
                target=_worker.run, name='{}-{}'.format(name, number),
                args=(dataset, theirs, self._progress, number, inherited),
                daemon=True)
            try:
                process.start()
            except (OSError, RuntimeError) as e:
                self.stop()
                raise RuntimeError(
                    "{}: worker {} did not start ({}: {}); with start_method "
                    "{!r} each worker imports the main module: is the "
                    "script's code under if __name__ == '__main__':?".format(
                        name, number, type(e).__name__, e,
                        start_method)) from e
            theirs.close()
            self._procs.append((process, mine))

    def __len__(self):
        return len(self._procs)

    def pids(self):
        """The workers' process ids."""
        return [process.pid for process, _ in self._procs]

    def reading(self, number):
        """The dataset index worker ``number`` is reading, -1 if none."""
        return self._progress[number]

    def send(self, number, message):
        try:
            self._procs[number][1].send(message)
        except OSError:
            self._died(number)

    def send_block(self, block):
        """Map ``block`` in every worker (its file descriptor travels over
        the pipe); the block's own descriptor is closed then."""
        for number, (process, conn) in enumerate(self._procs):
            try:
                conn.send(('block', block.size, block.per_example))
                multiprocessing.reduction.send_handle(conn, block.fd,
                                                      process.pid)
            except OSError:
                self._died(number)
        os.close(block.fd)  # each worker has received its own copy
        block.fd = None

    def receive(self, timeout):
        """``[(worker number, message)]`` that arrive within ``timeout``
        seconds (None: wait for the first)."""
        conns = {conn: number for number, (_, conn)
                 in enumerate(self._procs)}
        out = []
        for conn in multiprocessing.connection.wait(list(conns), timeout):
            try:
                out.append((conns[conn], conn.recv()))
            except (EOFError, OSError):
                dead = conns[conn]  # raised below, not chained to the EOF
                break
            self._answered.add(conns[conn])
        else:
            return out
        self._died(dead)

    def _died(self, number):
        """Raise WorkerDied saying which worker and what it was reading."""
        process = self._procs[number][0]
        process.join(5.0)
        code = process.exitcode
        if code is None:
            how = 'closed its pipe'
        elif code < 0:
            sig = signal.Signals(-code).name
            how = 'was killed by {}{}'.format(sig, {
                'SIGKILL': ' (out of memory?)',
                'SIGBUS': ' (out of shared memory?)'}.get(sig, ''))
        else:
            how = 'exited with status {}'.format(code)
        index = self.reading(number)
        if index >= 0:
            where = 'while reading example {} of the dataset'.format(index)
        elif number in self._answered:
            where = 'between examples'
        else:
            where = ('before reading any example (its error is above: can '
                     "it import the dataset's modules, and is the main "
                     "module's code under if __name__ == '__main__':?)")
        raise WorkerDied('{}: worker {} of {} (pid {}) {} {}'.format(
            self.name, number, len(self._procs), process.pid, how, where))

    def stop(self):
        """Stop and reap every worker (a no-op the second time)."""
        _stop(self._procs)
        _live.discard(self)
