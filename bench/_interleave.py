"""Benchmarks taking turns one training step at a time, in live workers.

This machine's speed drifts by 10-40% from one minute to the next (other
tenants of the host, the clock), so two runs a minute apart measure the
drift as much as the frameworks. Here each configuration (minichain, PyTorch,
an MPI job of N ranks) is a worker process that stays up: it warms up, then
runs one step whenever the driver asks. The driver asks each worker in
turn and pauses between steps, so that BLAS and OpenMP threads still
spinning after one step are asleep before the next one starts; each round
starts with the next worker, so that none always steps in the same place.
Matching steps of two workers are then seconds apart, and the benches print
the median over such pairs.

Commands travel through named pipes, one per rank, rather than through a
broadcast from rank 0: MPICH's waiting ranks poll at full speed, and a rank
spinning in a broadcast while another worker steps would take its core.

Worker side: :func:`serve`. Driver side: :class:`Worker`, :func:`take_turns`.
"""
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

PIPES_ENV = 'MINICHAIN_BENCH_PIPES'


# --- worker side -----------------------------------------------------------
def serve(step, warmup, finish, rank=0):
    """Warm up, then run one ``step()`` per command until told to quit.

    Args:
        step: runs one training step and returns its seconds. Under MPI
            every rank calls it, so it may be collective.
        warmup: steps run before the worker reports ready.
        finish: returns the worker's JSON-able summary; collective too.
        rank: only rank 0 writes to stdout.
    """
    for _ in range(warmup):
        step()
    _say(rank, 'READY')
    path = os.path.join(os.environ[PIPES_ENV], 'cmd.{}'.format(rank))
    with open(path) as pipe:
        # The driver holds the pipe open, so EOF means it is gone: finish.
        for line in pipe:
            cmd = line.strip()
            if cmd == 'quit':
                break
            if cmd != 'step':
                raise ValueError('serve: unknown command {!r} on {}'
                                 .format(cmd, path))
            seconds = step()
            _say(rank, 'TIME {!r}'.format(seconds))
    summary = finish()
    _say(rank, 'RESULT ' + json.dumps(summary))


def _say(rank, line):
    if rank == 0:
        sys.stdout.write(line + '\n')
        sys.stdout.flush()


# --- driver side -----------------------------------------------------------
class WorkerError(RuntimeError):
    """A worker exited, hung or answered nonsense."""


class Worker:
    """A live worker process; the constructor returns once it has warmed up.

    Args:
        name: what error messages call it.
        cmd: the command line (the worker calls :func:`serve`).
        ranks: how many ranks read commands (1 unless it is an MPI job).
        env: the environment (default: this one).
        timeout: seconds to wait for any one answer, warm-up included.
    """

    def __init__(self, name, cmd, ranks=1, env=None, timeout=900):
        self.name, self.timeout = name, timeout
        self._dir = tempfile.mkdtemp(prefix='minichain-bench-')
        self._fds, self.proc = [], None
        self._err = tempfile.TemporaryFile('w+')
        try:
            for r in range(ranks):
                path = os.path.join(self._dir, 'cmd.{}'.format(r))
                os.mkfifo(path)
                # O_RDWR opens without waiting for the reader.
                self._fds.append(os.open(path, os.O_RDWR))
            env = dict(os.environ if env is None else env)
            env[PIPES_ENV] = self._dir
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=self._err, env=env,
                text=True, start_new_session=True)
            self._lines = queue.Queue()
            threading.Thread(target=self._pump, daemon=True).start()
            self._expect('READY')
        except BaseException:
            self.close()
            raise

    def _pump(self):
        for line in self.proc.stdout:
            self._lines.put(line.rstrip('\n'))
        self._lines.put(None)

    def _expect(self, word):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                line = self._lines.get(
                    timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                raise WorkerError('{}: no {} within {} s'.format(
                    self.name, word, self.timeout)) from None
            if line is None:
                code = self.proc.wait()
                self.close()
                raise WorkerError('{} exited with code {} before {}:\n{}'
                                  .format(self.name, code, word,
                                          self._stderr_tail()))
            if line.startswith(word + ' ') or line == word:
                return line[len(word):].strip()

    def _stderr_tail(self, chars=3000):
        self._err.seek(0)
        return self._err.read()[-chars:]

    def _send(self, cmd):
        for fd in self._fds:
            os.write(fd, (cmd + '\n').encode())

    def step(self):
        """Run one step in the worker; its seconds."""
        self._send('step')
        return float(self._expect('TIME'))

    def finish(self):
        """Stop the worker; its summary (the dict it printed)."""
        self._send('quit')
        summary = json.loads(self._expect('RESULT'))
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        self.close()
        return summary

    def close(self):
        """Kill the worker (and its process group) if it still runs."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def take_turns(workers, steps, gap=0.3, rotate=True):
    """Ask each worker for one step in turn, ``steps`` rounds.

    With ``rotate``, round r starts with worker r (mod the count) and goes
    on in order, so that over as many rounds as workers each one steps in
    each position once: a step taken right after another kind of step (a
    job on one core after one on two, say) may run faster or slower on this
    VM, and a fixed order would hand that to the same worker every round.

    Returns:
        A list of rounds, each a dict {worker name: seconds}.
    """
    rounds = []
    for r in range(steps):
        k = r % len(workers) if rotate and workers else 0
        turn = {}
        for w in workers[k:] + workers[:k]:
            time.sleep(gap)  # let the last worker's spinning threads sleep
            turn[w.name] = w.step()
        rounds.append(turn)
    return rounds
