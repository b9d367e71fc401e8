"""The header: every collective opens with the same small message.

It is one MAX allreduce of 16 integers: the collective's kind, its sequence
number on the communicator, a hash of what the ranks must agree on (shapes,
dtypes, the root, a model's layout), a training step and a few values to
combine. Ranks that called different collectives meet in it whatever each
called, and all raise the same :class:`CollectiveMismatchError`, naming
every rank's call, instead of hanging (MPI would match an allreduce with
nothing, or, worse, with the other ranks' next allreduce). A local error (a
bad argument on one rank) travels in it too, so that every rank raises it.
It replaces the small exchanges the collectives made anyway (shapes,
lengths), so that the training path pays no extra message for it.
"""
import hashlib
import zlib

import numpy

from minichain.dist.failures import (  # noqa: F401 - also public here
    Failure, attempt, by_rank, format_ranks, raise_failures)

HEADER_SIZE = 16
N_MAXES, N_ROOT = 4, 4     # header slots: combined by max, set by the root
_UNSET = numpy.iinfo(numpy.int64).min
_codes = {}
_hashes = {}               # layout_hash's table: layout -> hash
_MAX_HASHES = 256
RAISE = 'raise_everywhere'  # the kind that the other kinds give way to


class CollectiveMismatchError(RuntimeError):
    """The ranks called different collectives (raised on every rank)."""


def _code(kind):
    code = _codes.get(kind)
    if code is None:
        code = _codes[kind] = zlib.crc32(kind.encode()) & 0x7FFFFFFF
    return code


def header(wire, agree=None, on_mismatch=None, maxes=(), root=None,
           root_values=(), step=None):
    """The first message of every collective (see the module docstring).

    One MAX allreduce of ``[code, -code, seq, -seq, h, -h, step, -step,
    maxes..., root values...]``: the ranks agree on a value iff its max
    equals minus the max of its negation.

    Args:
        wire: the communicator's :class:`~minichain.dist.guards.watchdog.Wire`,
            inside its ``collective(kind)`` block.
        agree: a picklable value every rank must hold equal (compared by a
            hash of its repr; may hold :class:`Failure` s).
        on_mismatch: ``on_mismatch(every rank's agree)`` returns the
            exception to raise (default: a ValueError listing them);
            Failures are raised first.
        maxes: up to 4 integers combined by max over the ranks.
        root, root_values: up to 4 integers that rank ``root`` provides.
        step: a training step (an int >= 0) every rank must be at, or None.
            It has slots of its own: the hash of a model's layout, the
            same from step to step, is then computed once (``layout_hash``).
    Returns:
        ``(maxes, root_values)`` combined, as tuples of ints.
    Raises:
        CollectiveMismatchError: the ranks are in different collectives
            or at different steps (unless one is in
            :func:`raise_everywhere`: then its error).
        whatever ``on_mismatch`` returns, or a Failure's error.
    """
    if len(maxes) > N_MAXES or len(root_values) > N_ROOT:
        raise ValueError('header: at most {} maxes and {} root values'
                         .format(N_MAXES, N_ROOT))
    kind, _, seq = wire.current()
    # A Python list, one array for MPI and back (the wire's allreduce_max):
    # a numpy operation per slot would cost more than the allreduce itself
    # (every step has one).
    v = [_UNSET] * HEADER_SIZE
    v[8:8 + len(maxes)] = map(int, maxes)  # numpy ints too
    if wire.rank == root:
        v[12:12 + len(root_values)] = map(int, root_values)
    if wire.size > 1:
        code, h = _code(kind), layout_hash(agree)
        s = -1 if step is None else int(step)
        v[:8] = code, -code, seq, -seq, h, -h, s, -s
        v = wire.allreduce_max(v)
        if v[0] != -v[1] or v[2] != -v[3]:
            calls = wire.allgather_obj((wire.describe(), seq, agree if (
                kind == RAISE) else None))
            raise_failures([failure for _, _, failure in calls])
            raise CollectiveMismatchError(collective_mismatch_message(
                wire, [call[:2] for call in calls]))
        if v[4] != -v[5] or v[6] != -v[7]:
            _mismatch(wire, kind, agree, step, on_mismatch)
    wire.joined = seq
    if isinstance(agree, Failure):  # a local error, raised here only
        raise_failures([agree])
    return tuple(v[8:8 + len(maxes)]), tuple(v[12:12 + len(root_values)])


def _mismatch(wire, kind, agree, step, on_mismatch):
    """Raise, on every rank, what the ranks disagree on: a Failure's error
    first, then different steps, then different ``agree`` values."""
    agreed, steps = zip(*wire.allgather_obj((agree, step)))
    raise_failures(agreed)
    if len(set(steps)) > 1:
        raise CollectiveMismatchError(
            '{}: the ranks are at different training steps: {} (a rank '
            'skipped an update, e.g. an exception caught and ignored, or '
            'ran out of data: every rank must call update the same '
            'number of times; see minichain.dist.join for shards of '
            'different lengths)'.format(kind, by_rank(
                steps, lambda s: 'update {}'.format(s + 1))))
    raise (on_mismatch or _differ(kind))(list(agreed))


def _differ(kind):
    def error(values):
        return ValueError('{}: the ranks passed different arguments: {}'
                          .format(kind, by_rank(values)))
    return error


def collective_mismatch_message(wire, calls):
    """The text of a CollectiveMismatchError: every rank's call."""
    lines = ['{}: {} (collective #{})'.format(format_ranks(ranks), what, seq)
             for (what, seq), ranks in _grouped(calls)]
    text = ('the ranks called different collectives of the {} communicator: '
            '{}; every rank must call the same collectives in the same order'
            .format(wire.label, '; '.join(lines)))
    whats = ' '.join(w for w, _ in calls)
    if 'multi_node_batch_normalization' in whats:
        text += (' (MultiNodeBatchNormalization communicates in training '
                 'mode only: is minichain.config.train the same on every '
                 'rank?)')
    elif 'multi_node_mean_grad' in whats:
        text += (' (a rank that calls update fewer times than the others '
                 'leaves them in multi_node_mean_grad: did it skip an update, '
                 'an exception caught and ignored, or run out of data? see '
                 'minichain.dist.join for shards of different lengths)')
    elif len({s for _, s in calls}) > 1:
        text += (' (a rank is ahead by a collective: did it leave one '
                 'halfway, an exception caught and ignored?)')
    return text


def _grouped(values):
    groups = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return list(groups.items())


def layout_hash(layout):
    """A 62-bit hash of a layout, equal on every process (never ``hash()``,
    which Python randomizes per process for strings).

    A hashable layout (a tuple, such as a training step's model layout)
    is hashed once: the next steps find it in a small table, where
    writing out its repr and hashing it would cost the step some 10 us."""
    try:
        return _hashes[layout]
    except KeyError:
        pass
    except TypeError:  # a list: not remembered
        return _digest(layout)
    if len(_hashes) >= _MAX_HASHES:
        _hashes.clear()
    value = _hashes[layout] = _digest(layout)
    return value


def _digest(layout):
    digest = hashlib.blake2b(repr(layout).encode(), digest_size=8).digest()
    return int.from_bytes(digest, 'little') & ((1 << 62) - 1)


def raise_everywhere(wire, error):
    """Raise ``error`` (a TypeError, ValueError or any exception that takes
    its message as only argument) on every rank of ``wire``.

    This rank opens a collective of its own; the other ranks meet it in
    whatever collective they are in or enter next, and raise the error
    there, as this rank does, with ``(on rank r)`` appended and
    ``raised_on_every_rank = True``. For an error that only one rank sees
    in the middle of training (a batch it cannot read), so that every rank
    stops with the same message instead of waiting for it.
    """
    with wire.collective(RAISE):
        header(wire, Failure(error))
