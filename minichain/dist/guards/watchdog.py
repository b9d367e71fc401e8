"""The stall watchdog: no rank waits forever in a collective.

Every MPI call minichain makes goes through a :class:`Wire`, one per
communicator (over a duplicate of its MPI communicator, so that user
messages never mix with minichain's). With the watchdog on, the Wire posts
the non-blocking form of each call and waits for it in a loop of
``MPI_Test``, which costs about what the blocking call costs
(``bench/watchdog_cost.py``) and gives three things:

* **Signals.** Python runs signal handlers between two tests, so a rank
  blocked in a collective still takes note of SIGTERM (the training script
  stops at the next iteration) and a second SIGTERM ends it.
* **Notes.** A rank that has waited ``notice`` seconds (1 s, less for short
  timeouts) sends every other rank of the communicator a note on a side
  communicator (a second duplicate): what it waits for, and later that it
  is done. A rank whose program ends (a normal return, ``sys.exit``, an
  uncaught exception with the abort hook off) sends a last note from an
  ``atexit`` hook: "left after collective #N". Waiting ranks read the notes.
* **Verdicts** (:mod:`minichain.dist.guards.stall_notes`). From the notes a
  waiting rank concludes within seconds that its collective cannot
  complete: a rank left before joining it, or a rank waits for something
  that needs this rank while this rank waits here (a waiting rank reads
  the notes of every communicator over the same ranks, such as the
  overlapped buckets' beside the main one). Failing that, it gives
  up after ``MINICHAIN_STALL_TIMEOUT`` seconds. Either way it prints one
  line per fact (its collective and call count, what each other rank was
  last seen doing) and ends the whole job (``MPI_Abort``).

Why notes sent by ranks that already wait, rather than questions or
one-sided reads: the good path pays nothing (a wait shorter than ``notice``
sends no message), and a note needs nothing from its receiver until the
receiver waits too, which is exactly when it matters. A rank that computes,
is stopped (SIGSTOP) or sits in a call outside minichain cannot answer a
question, nor serve a passive one-sided read in MPICH (its progress engine
runs only inside MPI calls): it stays silent either way, and its silence
plus the last collective every rank passed is what the report shows.

Collectives of different kinds (allreduce on one rank, bcast on another)
are caught earlier, without waiting: every collective opens with the same
small header (:func:`minichain.dist.guards.agreement.header`) carrying its kind and
sequence number, so the ranks meet there whatever each called.

Before that, a rank that has waited ``MINICHAIN_STALL_WARN`` seconds
(default 60; 0: never) prints one line naming the ranks it waits for and
what each was last seen doing, and again after each as many seconds, as
Horovod's stall inspector does: a rank merely slow or stuck outside a
collective is otherwise silent until the timeout. Of the ranks waiting in
the same collective only the lowest prints.

``MINICHAIN_STALL_TIMEOUT``: seconds (default 600); ``0`` turns the
watchdog off: the blocking MPI calls are made directly, no notes are sent,
signal handlers wait for the call to return, and a stalled job waits
forever, as plain MPI does. Rank 0's value applies to the communicator.
"""
import array
import atexit
import math
import os
import pickle
import sys
import time

from minichain.dist import mpi, shm_files
from minichain.dist.guards import stall_notes

ENV = 'MINICHAIN_STALL_TIMEOUT'
DEFAULT_TIMEOUT = 600.0
ENV_WARN = 'MINICHAIN_STALL_WARN'
DEFAULT_WARN = 60.0
EXIT_STATUS = 70          # the job's exit status when the watchdog ends it
PREFIX = 'minichain.dist watchdog: '
SPIN = 1.0                # seconds of back-to-back tests before napping
NAP = 0.001               # seconds between tests after SPIN
READ_EVERY = 0.02         # seconds between two looks at the notes
YIELD_EVERY = 32          # tests between two yields of the core
ABORT_DELAY = 1.0         # seconds between the last words and MPI_Abort

_yield = getattr(os, 'sched_yield', lambda: time.sleep(0))
# Every Wire until it is freed (the communicator's finalize), held strongly:
# the exit note must leave from a communicator that was a local of main()
# and is gone before the atexit hook runs (a weak set lost it, and the other
# ranks waited out the whole stall timeout).
_wires = set()
_clock = {'progress': None}
_exit = {'installed': False, 'reason': None}


def timeout_from_env(name=ENV, default=DEFAULT_TIMEOUT):
    """``MINICHAIN_STALL_TIMEOUT`` (or ``name``) in seconds (0: off);
    ValueError naming the variable for anything but a finite number >= 0."""
    text = os.environ.get(name, '').strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError('{}={!r}: expected a number of seconds >= 0 (0 turns '
                         '{} off)'.format(name, text, 'the watchdog' if name
                                          == ENV else 'it'))
    return value


def stalled():
    """Whether this process has made no progress through minichain's
    collectives for longer than its stall timeout (never when the watchdog
    is off or no communicator exists). The training script's signal handler
    ends the process at once on a first SIGTERM when this holds."""
    wires = [w for w in list(_wires) if w.timeout > 0]
    if not wires or _clock['progress'] is None:
        return False
    idle = time.monotonic() - _clock['progress']
    return idle > min(w.timeout for w in wires)


def abort(status):
    """End the whole job with ``status`` (MPI_Abort), once what this rank
    wrote had a moment to reach the launcher: it may kill the job before
    reading the last lines of a rank's output pipe."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        # What MPI_Abort skips; before the pause, since a rank that aborts
        # at the same time may kill this one meanwhile.
        shm_files.before_abort()
        time.sleep(ABORT_DELAY)
    finally:
        mpi.import_mpi().COMM_WORLD.Abort(status)
        # MPICH returns when another rank's abort is already ending the job;
        # this process ends here too, as MPI_Abort would have ended it (its
        # Python exit would redo the cleanup above and fail on it).
        os._exit(status)


def _persistent_max(comm, n):
    """``(buffer, request)``: a persistent MAX allreduce, in place, of ``n``
    int64 (request None where the MPI has no persistent collectives)."""
    MPI = mpi.import_mpi()
    buf = array.array('q', bytes(8 * n))
    try:
        return buf, comm.Allreduce_init(MPI.IN_PLACE, buf, op=MPI.MAX)
    except (AttributeError, NotImplementedError, MPI.Exception):
        return buf, None


def note_uncaught(exc_type):
    """Record that the program is ending on an uncaught exception (called by
    the abort hook when it does not abort), for the exit note."""
    _exit['reason'] = 'an uncaught {}'.format(exc_type.__name__)


class Wire:
    """MPI calls that cannot hang unnoticed, over a duplicate of ``mpi_comm``.

    The upper-case methods mirror mpi4py's blocking ones (``Allreduce``,
    ``Bcast``, ``Allgather``, ``Allgatherv``, ``Reduce_scatter``, ``Send``,
    ``Recv``), and
    ``Iallreduce``, ``Isend`` and ``Irecv`` post one to finish later
    (``test``, ``wait``);
    ``allgather_obj`` gathers small picklable objects. ``collective(kind)``
    brackets one collective (a ``with`` block; nested ones count too): it
    numbers it, for the header and for the reports.

    Args:
        mpi_comm: the communicator to duplicate (collective: every rank of
            it creates its Wire together).
        label: how reports name the communicator (e.g. ``'flat'``).
    """

    def __init__(self, mpi_comm, label):
        self.comm = mpi_comm.Dup()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.label = label
        self.seq = 0               # collectives begun on this rank
        self.counts = {}           # per kind
        self.stack = []            # [(kind, count, seq)] of open collectives
        self.last = None           # (kind, count, seq) of the last finished
        value = timeout_from_env(), timeout_from_env(ENV_WARN, DEFAULT_WARN)
        self.timeout, self.warn_every = map(float, self.comm.bcast(value))
        self.polling = self.timeout > 0
        self.joined = 0            # the last collective every rank joined
        self.side = None
        self.notice = min(1.0, self.timeout / 4)
        self.peers = {}            # rank -> the last note it sent
        self.elsewhere = {}        # rank -> its newer note on a sibling
        self.members = None        # the world ranks, to find the siblings
        self.outbox = []           # [(request, bytes)] of notes in flight
        self.waiting = None        # what this rank waits for, while it does
        self.on_stall = None       # run before giving up (see wait_until)
        self.persistent_max = None  # (buffer, request): allreduce_max
        if self.polling and self.size > 1:
            self.side = self.comm.Dup()
            world = mpi.import_mpi().COMM_WORLD.Get_group()
            self.members = tuple(self.comm.Get_group().Translate_ranks(
                list(range(self.size)), world))
            _install_exit_note()
        _wires.add(self)
        if _clock['progress'] is None:
            _clock['progress'] = time.monotonic()

    # -- numbering ------------------------------------------------------------
    def collective(self, kind):
        """Open collective ``kind``: ``with wire.collective('allreduce'):``."""
        self.seq += 1
        count = self.counts[kind] = self.counts.get(kind, 0) + 1
        self.stack.append((kind, count, self.seq))
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Close the innermost collective (what leaving its ``with`` block
        does), for one that spans several calls, such as an overlapped
        gradient averaging opened during backward and closed by update."""
        self.last = self.stack.pop()
        _clock['progress'] = time.monotonic()

    def current(self):
        """``(kind, count, seq)`` of the innermost open collective."""
        return self.stack[-1]

    def describe(self):
        """The open collectives, innermost first: ``'bcast_obj #2 in
        bcast_data #1'``; the last finished one when none is open."""
        if not self.stack:
            return ('outside collectives (after {} #{}, collective #{})'
                    .format(*self.last) if self.last else
                    'before any collective')
        return ' in '.join('{} #{}'.format(k, c)
                           for k, c, _ in reversed(self.stack))

    # -- MPI calls ------------------------------------------------------------
    def Allreduce(self, sendbuf, recvbuf, op):
        if not self.polling:
            return self.comm.Allreduce(sendbuf, recvbuf, op=op)
        self._wait(self.comm.Iallreduce(sendbuf, recvbuf, op=op))

    def Bcast(self, buf, root=0):
        if not self.polling:
            return self.comm.Bcast(buf, root=root)
        self._wait(self.comm.Ibcast(buf, root=root))

    def Allgather(self, sendbuf, recvbuf):
        if not self.polling:
            return self.comm.Allgather(sendbuf, recvbuf)
        self._wait(self.comm.Iallgather(sendbuf, recvbuf))

    def Allgatherv(self, sendbuf, recvbuf):
        if not self.polling:
            return self.comm.Allgatherv(sendbuf, recvbuf)
        self._wait(self.comm.Iallgatherv(sendbuf, recvbuf))

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts, op):
        if not self.polling:
            return self.comm.Reduce_scatter(sendbuf, recvbuf, recvcounts, op)
        self._wait(self.comm.Ireduce_scatter(sendbuf, recvbuf, recvcounts,
                                             op))

    def Barrier(self):
        if not self.polling:
            return self.comm.Barrier()
        self._wait(self.comm.Ibarrier())

    def Send(self, buf, dest, tag=0):
        if not self.polling:
            return self.comm.Send(buf, dest=dest, tag=tag)
        self._wait(self.comm.Isend(buf, dest=dest, tag=tag), ('send to', dest))

    def Recv(self, buf, source, tag=0, status=None):
        if not self.polling:
            return self.comm.Recv(buf, source=source, tag=tag, status=status)
        self._wait(self.comm.Irecv(buf, source=source, tag=tag), (
            'receive from', source if source >= 0 else 'any rank'), status)

    def Iallreduce(self, sendbuf, recvbuf, op):
        """Post a non-blocking Allreduce; returns its request, for
        :meth:`test` and :meth:`wait` (several may be in flight)."""
        return self.comm.Iallreduce(sendbuf, recvbuf, op=op)

    def Isend(self, buf, dest, tag=0):
        """Post a non-blocking send; returns its request (for :meth:`wait`)."""
        return self.comm.Isend(buf, dest=dest, tag=tag)

    def Irecv(self, buf, source, tag=0):
        """Post a non-blocking receive; returns its request (for
        :meth:`wait`)."""
        return self.comm.Irecv(buf, source=source, tag=tag)

    def test(self, requests):
        """Whether every request has completed; each call lets MPI progress
        them (MPICH moves a non-blocking collective on only inside MPI
        calls)."""
        return mpi.import_mpi().Request.Testall(requests)

    def wait(self, request):
        """Wait for a request of :meth:`Iallreduce`, :meth:`Isend` or
        :meth:`Irecv`, watched as the blocking calls are (signals, notes,
        verdicts, the stall timeout), as part of the open collective."""
        if not self.polling:
            return request.Wait()
        self._wait(request)

    def allgather_obj(self, obj):
        """Every rank's picklable ``obj``, in rank order (two messages)."""
        return mpi.allgather_obj(self, obj)

    def wait_until(self, done, what, on_stall=None):
        """Wait until ``done()`` is true (e.g. a CUDA event has passed) as for
        an MPI request; ``what`` names it in the reports. ``on_stall()``
        runs before the job is ended on a stall: work that MPI_Abort cannot
        stop is stopped there (the NCCL communicator is aborted, so that its
        kernels stop spinning on the GPU), as PyTorch's NCCL watchdog does,
        and returns a line for the report."""
        if done():
            return
        if not self.polling:
            while not done():
                time.sleep(NAP)
            return
        self.on_stall = on_stall
        try:
            self._wait_slow(done, ('wait for', what))
        finally:
            self.on_stall = None

    def allreduce_max(self, values):
        """The list of int64 ``values`` (the guards' header) combined by
        MAX over the ranks, as a new list. Through one persistent request
        (MPI 4's ``Allreduce_init``, made at the first call, which is
        collective like every header): starting it costs 1.5 us here where
        posting a new Iallreduce costs 2.3, and a 4 KB averaging is made of
        such microseconds. A length other than the first's, or an MPI
        without persistent collectives (Open MPI 4.1), posts a new one."""
        if self.persistent_max is None:
            self.persistent_max = _persistent_max(self.comm, len(values))
        buf, request = self.persistent_max
        MPI = mpi.import_mpi()
        if request is None or len(values) != len(buf):
            buf = array.array('q', values)
            self.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
        else:
            buf[:] = array.array('q', values)
            request.Start()
            self.wait(request)
        return buf.tolist()

    def free(self):
        """Free the duplicates (collective, like MPI_Comm_free)."""
        _wires.discard(self)
        if self.persistent_max and self.persistent_max[1] is not None:
            self.persistent_max[1].Free()
        self.persistent_max = None
        for comm in (self.side, self.comm):
            if comm is not None:
                comm.Free()
        self.side = self.comm = None

    # -- waiting --------------------------------------------------------------
    def _wait(self, request, p2p=None, status=None):
        if not request.Test(status):
            self._wait_slow(lambda: request.Test(status), p2p)

    def _wait_slow(self, done, p2p):
        # Most waits end within microseconds: test back to back, now and then
        # yielding the core (as MPICH's own blocking wait does: on a busy
        # machine the rank being waited for may need it) and looking at the
        # clock; start watching after READ_EVERY seconds.
        start = time.monotonic()
        until, spins = start + READ_EVERY, 0
        while not done():
            spins += 1
            if spins % YIELD_EVERY == 0:
                _yield()
                if time.monotonic() >= until:
                    self._watch(done, p2p, start)
                    return

    def _watch(self, done, p2p, start):
        """Wait for ``done()`` while reading the notes: post this rank's
        own after ``notice`` seconds, give up on a verdict that held for
        its grace, or after the stall timeout."""
        self.waiting = self._state(p2p)
        # verdict: (conclusion, when to give up on it); a new conclusion
        # starts its grace afresh.
        posted, verdict, next_read = False, None, 0.0
        next_warning = self.warn_every or math.inf
        try:
            while not done():
                now = time.monotonic()
                waited = now - start
                if waited >= next_warning:
                    next_warning += self.warn_every
                    self._warn(waited)
                if now >= next_read and self.side is not None:
                    next_read = now + READ_EVERY
                    self._read_notes()
                    self._look_at_siblings()
                    if not posted and waited >= self.notice:
                        self._post(dict(self.waiting, state='waiting',
                                        waited=waited))
                        posted = True
                    found = stall_notes.verdict(self.waiting, self.peers,
                                                 self.rank, self.notice,
                                                 self.elsewhere)
                    if found is None or verdict is None or (
                            found[0] != verdict[0]):
                        verdict = found and (found[0], now + found[1])
                    if verdict is not None and now >= verdict[1]:
                        self._give_up(waited, verdict[0])
                if waited > self.timeout + stall_notes.defer(
                        self.waiting, self.peers, self.rank, self.notice):
                    self._give_up(waited, None)
                if waited > SPIN:
                    time.sleep(NAP)
                else:
                    _yield()
        finally:
            if posted:
                self._post(dict(self.waiting, state='done'))
            self.waiting = None

    def _state(self, p2p):
        """This rank's note: which collective (or message) it waits for."""
        state = {'seq': self.seq, 'what': self.describe(), 'peer': None,
                 'collective': bool(self.stack) and p2p is None}
        if p2p is not None:
            verb, peer = p2p
            state['what'] = '{} {}, {}'.format(
                verb, peer if isinstance(peer, str) else 'rank {}'.format(
                    peer), state['what'] if not self.stack else 'in ' +
                state['what'])
            state['peer'] = peer if isinstance(peer, int) else None
        return state

    # -- notes ----------------------------------------------------------------
    def _post(self, note):
        # 'at': the sender's clock, which orders one rank's notes across
        # communicators (where it waits now is its newest note)
        data = pickle.dumps(dict(note, at=time.monotonic()),
                            pickle.HIGHEST_PROTOCOL)
        self.outbox = [(q, d) for q, d in self.outbox if not q.Test()]
        for r in range(self.size):
            if r != self.rank:
                request = self.side.Isend(data, dest=r, tag=mpi.TAG_NOTE)
                self.outbox.append((request, data))

    def _read_notes(self):
        MPI = mpi.import_mpi()
        status = MPI.Status()
        while self.side.Iprobe(MPI.ANY_SOURCE, mpi.TAG_NOTE, status):
            buf = bytearray(status.Get_count(MPI.BYTE))
            self.side.Recv(buf, source=status.Get_source(), tag=mpi.TAG_NOTE)
            note = pickle.loads(bytes(buf))
            note['received'] = time.monotonic()
            self.peers[status.Get_source()] = note

    def _look_at_siblings(self):
        """Read the notes that reach this rank's other Wires over the same
        ranks (the overlapped buckets' communicator beside the main one),
        for ``elsewhere`` (``_stall_notes.newest_elsewhere``)."""
        siblings = [w for w in list(_wires) if w is not self and
                    w.side is not None and w.members == self.members]
        for wire in siblings:
            wire._read_notes()
        self.elsewhere = stall_notes.newest_elsewhere(self.peers,
                                                       siblings)

    def _leave(self, reason):
        """Tell the other ranks that this one left (from the exit hook);
        the notes are in ``outbox`` until sent."""
        kind = self.stack[-1] if self.stack else self.last
        what = '{} #{}'.format(*kind[:2]) if kind else 'no collective yet'
        self._post({'state': 'left', 'seq': self.seq, 'what': what,
                    'reason': reason, 'peer': None, 'collective': False})

    # -- warning and giving up ------------------------------------------------
    def _warn(self, waited):
        if self.side is None or self.waiting is None or waited >= self.timeout:
            return
        if stall_notes.defer(self.waiting, self.peers, self.rank,
                              self.notice):
            return  # a lower rank waiting in the same collective warns
        line = stall_notes.warning(self, waited)
        sys.stderr.write('[rank {}] {}warning: {}; the job ends after {:g} s '
                         '({}; {}={:g} s between warnings)\n'.format(
                             self.rank, PREFIX, line, self.timeout, ENV,
                             ENV_WARN, self.warn_every))
        sys.stderr.flush()

    def _give_up(self, waited, verdict):
        lines = stall_notes.report(self, waited, verdict)
        if self.on_stall is not None:
            try:
                lines.append(self.on_stall())
            except Exception as e:  # noqa: BLE001 - ending the job anyway
                lines.append('stopping the work waited for failed: {}: {}'
                             .format(type(e).__name__, e))
        lines.append('ending the job with exit status {} ({}={:g} s; 0 turns '
                     'the watchdog off)'.format(EXIT_STATUS, ENV,
                                                self.timeout))
        text = ''.join('[rank {}] {}{}\n'.format(self.rank, PREFIX, line)
                       for line in lines)
        try:
            sys.stdout.flush()
            sys.stderr.write(text)
        finally:
            abort(EXIT_STATUS)


def _install_exit_note():
    if not _exit['installed']:
        _exit['installed'] = True
        atexit.register(_announce_exit)


def _announce_exit():
    try:
        MPI = mpi.import_mpi()
        if MPI.Is_finalized():
            return
    except ImportError:
        return
    reason = _exit['reason'] or 'its program ended: a return or sys.exit'
    wires = [w for w in list(_wires) if w.side is not None]
    for wire in wires:
        try:
            wire._leave(reason)
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    # one second for all the notes to go out, however many communicators
    deadline = time.monotonic() + 1.0
    try:
        while time.monotonic() < deadline and not all(
                q.Test() for w in wires for q, _ in w.outbox):
            time.sleep(NAP)
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
