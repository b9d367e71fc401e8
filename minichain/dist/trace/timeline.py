"""A communication timeline: when each rank computed, packed and reduced.

Turn it on for a whole run with the environment variable
``MINICHAIN_TIMELINE=trace.json`` (read when the first communicator is
created; set it on every rank, as ``mpiexec`` does by passing the
environment), or around some steps with the context manager::

    with timeline.record('trace.json', comm):
        for x, t in batches:
            opt.update(model, x, t)

While recording, every rank notes the start and end of ``forward``,
``backward`` and ``update`` (timed by the multi-node optimizer), ``sync``
(the agreement header before an averaging after backward: where a rank
that finished backward early waits for the slower one), ``pack``,
``allreduce``, ``unpack`` and ``bcast`` (timed by the communicators), with
the bytes moved; an overlapped averaging (:mod:`minichain.dist.averaging.overlap`)
adds the instant each gradient is final (``grad``) and each bucket is
complete (``ready``), each bucket's ``bucket`` (from its launch to the
moment its completion was seen) and the ``wait`` for the last ones after
backward. The instrumented code wraps each step in a :func:`span`::

    with timeline.span('allreduce', buf.nbytes):
        wire.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
 At the end (leaving the ``with`` block; for the
environment variable, the creating communicator's ``finalize()`` or the
exit of the process) rank 0 gathers every rank's events, writes one Chrome
trace (open it in chrome://tracing or https://ui.perfetto.dev: one process
per rank, one thread per category: compute, copy, comm) and prints a
summary with the bus bandwidth of each allreduce.

Costs: while nothing records, :func:`span` returns one shared object whose
``with`` does nothing (no object made, no clock read; see
``bench/timeline_cost.py``). While recording on a GPU, the device is
synchronized at every event boundary, so the times are real but GPU work
no longer overlaps (e.g. double buffering).
"""
import atexit
import contextlib
import json
import os
import time

from minichain import backend
from minichain.dist import hooks

__all__ = ['ENV', 'Recorder', 'record', 'span', 'start', 'summarize',
           'to_trace']

ENV = 'MINICHAIN_TIMELINE'
CATEGORIES = ('compute', 'copy', 'comm')  # tid = index
_CATEGORY = {'forward': 'compute', 'backward': 'compute', 'update': 'compute',
             'grad': 'compute', 'pack': 'copy', 'unpack': 'copy'}
_ORDER = ('forward', 'backward', 'grad', 'ready', 'sync', 'pack', 'allreduce',
          'bucket', 'wait', 'unpack', 'update', 'bcast')
_MAX_ROWS = 8

active = None  # the Recorder in use, or None


class Recorder:
    """Collects this rank's events; ``finish()`` merges and writes them.

    Args:
        path: where rank 0 writes the Chrome trace JSON.
        comm: a minichain communicator, an ``mpi4py`` communicator, or any
            object with ``rank`` and ``size`` (size 1: no MPI is used).
            With more than one rank, creating and finishing are collective.
        out: called with rank 0's summary text (default ``print``; None:
            no summary).

    Attributes:
        events: this rank's ``(name, start_s, end_s, nbytes)`` tuples,
            seconds on ``time.perf_counter``'s clock.
    """

    def __init__(self, path, comm, out=print):
        self.path = os.fspath(path)
        self._comm = getattr(comm, 'mpi_comm', comm)
        self.rank, self.size = self._comm.rank, self._comm.size
        self._print = out
        self.events = []
        self.finished = False
        self.owner = None  # the communicator whose creation started it
        if self.size > 1:
            self._comm.Barrier()  # time zero: every rank leaves it together
        self._t0 = time.perf_counter()

    def start(self, sync=False):
        """The clock now; ``sync``: first wait for the current GPU."""
        if sync:
            backend.get_cupy().cuda.Device().synchronize()
        return time.perf_counter()

    def stop(self, name, start, nbytes=None, sync=False):
        """Record event ``name`` from ``start`` to now; return now, the start
        of a following event."""
        end = self.start(sync)
        self.events.append((name, start, end, nbytes))
        return end

    def abandon(self):
        """Stop recording without merging or writing anything."""
        global active
        if active is self:
            active = None
        self.finished = True

    def finish(self):
        """Gather every rank's events on rank 0, write the trace there and
        print the summary (collective). Returns the trace dict on rank 0,
        None elsewhere; a second call does nothing."""
        if self.finished:
            return None
        self.abandon()
        t0 = self._t0
        mine = [(n, s - t0, e - t0, b) for n, s, e, b in self.events]
        if self.size == 1:
            per_rank = [mine]
        else:
            from minichain.dist import mpi
            if self.rank != 0:
                mpi.send_obj(self._comm, mine, 0, tag=mpi.TAG_TIMELINE)
                return None
            per_rank = [mine] + [
                mpi.recv_obj(self._comm, r, tag=mpi.TAG_TIMELINE)
                for r in range(1, self.size)]
        trace = to_trace(per_rank)
        tmp = '{}.tmp{}'.format(self.path, os.getpid())
        with open(tmp, 'w') as f:
            json.dump(trace, f)
        os.replace(tmp, self.path)
        if self._print is not None:
            self._print(summarize(trace) + '\ntimeline: wrote ' + self.path)
        return trace


class _Span:
    """One step being timed while a Recorder records (see :func:`span`)."""

    __slots__ = ('recorder', 'name', 'nbytes', 'sync', 'started')

    def __init__(self, recorder, name, nbytes, sync):
        self.recorder, self.name = recorder, name
        self.nbytes, self.sync = nbytes, sync

    def __enter__(self):
        self.started = self.recorder.start(self.sync)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:  # a step that raised is not an event
            self.stop()

    def start(self):
        """Start timing outside a ``with`` block (a step that ends in
        another call); returns self."""
        return self.__enter__()

    def stop(self):
        """End the event begun by :meth:`start`."""
        self.recorder.stop(self.name, self.started, self.nbytes, self.sync)


# While nothing records: the protocol's own do-nothing span (its hook).
NO_SPAN = hooks.NO_SPAN


def span(name, nbytes=None, sync=False):
    """Time the ``with`` block as event ``name`` of the active Recorder.

    Args:
        name: the event (``'pack'``, ``'allreduce'``...); its name gives
            its category (compute, copy or comm).
        nbytes: the bytes the step moves (None for compute).
        sync: wait for the current GPU at both ends, so that the kernels
            the block launched are inside the event.
    Returns:
        A context manager; while nothing records, always the same
        :data:`NO_SPAN`, so the step costs one call and an empty ``with``.
    """
    recorder = active
    if recorder is None:
        return NO_SPAN
    return _Span(recorder, name, nbytes, sync)


def mark(name, nbytes=None):
    """Record an instant (an event of no duration), e.g. the moment a
    gradient became final; does nothing while nothing records."""
    recorder = active
    if recorder is not None:
        now = recorder.start()
        recorder.events.append((name, now, now, nbytes))


def to_trace(per_rank):
    """Build the Chrome trace dict from ``per_rank[r]`` = rank r's list of
    ``(name, start_s, end_s, nbytes)`` (seconds from a common zero).

    Events are ``ph: 'X'`` (complete) with ``pid`` = rank, ``tid`` = the
    category's index in ``CATEGORIES``, ``ts``/``dur`` in microseconds and
    ``args`` = ``{'seq': k}`` (the k-th event of that name on that rank),
    plus ``'bytes'`` for copies and communication. Metadata events name the
    processes (``rank r``) and threads.
    """
    events = []
    for rank, recorded in enumerate(per_rank):
        events.append({'name': 'process_name', 'ph': 'M', 'pid': rank,
                       'tid': 0, 'args': {'name': 'rank {}'.format(rank)}})
        for tid, cat in enumerate(CATEGORIES):
            events.append({'name': 'thread_name', 'ph': 'M', 'pid': rank,
                           'tid': tid, 'args': {'name': cat}})
        seq = {}
        for name, start, end, nbytes in recorded:
            cat = _CATEGORY.get(name, 'comm')
            args = {'seq': seq.setdefault(name, 0)}
            seq[name] += 1
            if nbytes is not None:
                args['bytes'] = int(nbytes)
            events.append({'name': name, 'cat': cat, 'ph': 'X', 'pid': rank,
                           'tid': CATEGORIES.index(cat),
                           'ts': round(start * 1e6, 3),
                           'dur': round((end - start) * 1e6, 3),
                           'args': args})
    return {'traceEvents': events, 'displayTimeUnit': 'ms',
            'otherData': {'ranks': len(per_rank),
                          'producer': 'minichain.dist.trace.timeline'}}


def _by_rank(trace, name):
    ranks = {}
    for e in trace['traceEvents']:
        if e['ph'] == 'X' and e['name'] == name:
            ranks.setdefault(e['pid'], []).append(e)
    return [sorted(v, key=lambda e: e['args']['seq'])
            for _, v in sorted(ranks.items())]


def summarize(trace):
    """A short text summary of a trace made by :func:`to_trace`.

    One line of total milliseconds per event kind (mean over ranks), then
    the allreduces: the k-th allreduce of every rank is one collective; its
    time is the longest of the ranks' durations, and

    .. math:: \\mathrm{algbw} = \\frac{n}{t}, \\qquad
              \\mathrm{busbw} = \\mathrm{algbw} \\cdot \\frac{2(p-1)}{p}

    (``n`` bytes per rank, ``p`` ranks; busbw is what each link carried in
    a ring allreduce, comparable across rank counts, as NCCL's tests
    report it). The first rows are listed, then the totals.
    """
    p = trace['otherData']['ranks']
    kinds = sorted({e['name'] for e in trace['traceEvents'] if e['ph'] == 'X'},
                   key=lambda n: (_ORDER.index(n) if n in _ORDER
                                  else len(_ORDER), n))
    totals = ['{} {:.3f}'.format(k, sum(e['dur'] for r in _by_rank(trace, k)
                                        for e in r) / p / 1e3) for k in kinds]
    lines = ['timeline: {} rank{}; ms per rank: {}'.format(
        p, '' if p == 1 else 's', ', '.join(totals) or 'no events')]
    ranks = _by_rank(trace, 'allreduce')
    count = min((len(r) for r in ranks), default=0) if len(ranks) == p else 0
    counts = [len(r) for r in ranks] + [0] * (p - len(ranks))
    if len(set(counts)) > 1:
        lines.append('warning: allreduces per rank differ: {}'.format(counts))
    lines += _waits(trace, p)
    if count == 0:
        return '\n'.join(lines + _buckets(trace, p))
    lines.append('{:>9} {:>12} {:>10} {:>12} {:>12}'.format(
        'allreduce', 'bytes', 'ms', 'algbw GB/s', 'busbw GB/s'))
    factor = 2.0 * (p - 1) / p
    sum_bytes = sum_us = 0.0
    for k in range(count):
        nbytes = ranks[0][k]['args'].get('bytes', 0)
        us = max(r[k]['dur'] for r in ranks)
        sum_bytes, sum_us = sum_bytes + nbytes, sum_us + us
        if k < _MAX_ROWS:
            lines.append(_row(k, nbytes, us, factor))
    if count > _MAX_ROWS:
        lines.append('{:>9}'.format('...'))
    lines.append(_row('all {}'.format(count), sum_bytes, sum_us, factor))
    return '\n'.join(lines)


def _waits(trace, p):
    """Where the ranks waited for each other, rank by rank: ``sync`` (the
    header of an averaging after backward) and ``wait`` (the exposed end of
    an overlapped one). One rank's long wait is the other's slow step."""
    lines = []
    for name, what in (('sync', 'waiting in the header for the slower rank'),
                       ('wait', 'waiting after backward for the buckets '
                                '(and the slower rank)')):
        ranks = _by_rank(trace, name)
        if ranks:
            lines.append('{}: ms per rank: {}'.format(what, ', '.join(
                '{} {:.3f}'.format(r[0]['pid'], sum(e['dur'] for e in r) / 1e3)
                for r in ranks)))
    return lines


def _buckets(trace, p):
    """The overlapped averaging's buckets, when there is no allreduce after
    backward to list."""
    ranks = _by_rank(trace, 'bucket')
    if not ranks:
        return ['no allreduce recorded']
    count = min(len(r) for r in ranks)
    nbytes = sum(e['args'].get('bytes', 0) for e in ranks[0][:count])
    return ['allreduce overlapped with backward: {} bucket{} a rank, {:,.0f} '
            'bytes, {:.3f} ms in flight (mean over ranks, launch to seen '
            'complete)'.format(count, '' if count == 1 else 's', nbytes,
                               sum(e['dur'] for r in ranks for e in r[:count])
                               / len(ranks) / 1e3)]


def _row(label, nbytes, us, factor):
    algbw = nbytes / us / 1e3 if us > 0 else 0.0  # bytes/us -> GB/s
    return '{:>9} {:>12,.0f} {:>10.3f} {:>12.4g} {:>12.4g}'.format(
        label, nbytes, us / 1e3, algbw, algbw * factor)


def _world():
    """MPI.COMM_WORLD, or a one-rank stand-in without mpi4py."""
    from minichain.dist import mpi
    try:
        return mpi.import_mpi().COMM_WORLD
    except ImportError:
        return _Alone()


class _Alone:
    rank, size = 0, 1


def start(path, comm=None, out=print):
    """Start recording into ``path`` (see :class:`Recorder`); ``comm`` None
    means ``MPI.COMM_WORLD``. Returns the Recorder, now ``active``.

    Raises:
        RuntimeError: a timeline is already being recorded.
    """
    global active
    if active is not None:
        raise RuntimeError('timeline: already recording into {}; finish it '
                           'first'.format(active.path))
    active = Recorder(path, _world() if comm is None else comm, out)
    return active


@contextlib.contextmanager
def record(path, comm=None, out=print):
    """Record the timeline of the ``with`` block into ``path``.

    Collective: every rank of ``comm`` (default ``MPI.COMM_WORLD``) enters
    and leaves the block. On leaving, rank 0 writes the merged trace and
    prints the summary. When the block raises, recording stops without
    merging (another rank may be stuck elsewhere) and nothing is written.

    Yields:
        the Recorder (its ``events`` are this rank's).
    """
    recorder = start(path, comm, out)
    try:
        yield recorder
    except BaseException:
        recorder.abandon()
        raise
    recorder.finish()


def start_from_env(comm):
    """Start recording if ``MINICHAIN_TIMELINE`` is set and nothing records
    yet (called by every communicator's constructor). The trace is written
    when ``comm`` is finalized or, failing that, when the process exits."""
    path = os.environ.get(ENV)
    if not path or active is not None:
        return
    recorder = start(path, comm)
    recorder.owner = comm
    atexit.register(recorder.finish)


def finish_owned(comm):
    """Finish the recording that ``comm``'s creation started, if any
    (called by ``finalize``)."""
    if active is not None and active.owner is comm:
        active.finish()
