"""Safety that keeps a data-parallel job from hanging or silently diverging.

Three guards, all on by default (the stall watchdog, the fourth, lives in
:mod:`minichain.dist.guards.watchdog`):

* **The header** of every collective (:mod:`minichain.dist.guards.agreement`):
  ranks that called different collectives, or passed different arguments,
  all raise the same error instead of hanging.
* **Same-model check.** Before every gradient allreduce and every
  ``bcast_data``, the header compares a hash of the parameter layout
  (names, shapes, dtypes in path order). On a mismatch every rank gathers
  the layouts and raises the same :class:`ModelMismatchError` with a table
  of the differing parameters by rank, instead of entering a collective
  with a different buffer size (which hangs or corrupts).
* **Abort on an uncaught exception.** Creating a communicator installs a
  ``sys.excepthook`` that prints the traceback prefixed with the rank and
  calls ``MPI.COMM_WORLD.Abort(1)``, so an error on one rank ends the whole
  job instead of leaving the others waiting forever in a collective. Turn it
  off with the environment variable ``MINICHAIN_NO_ABORT=1`` or by calling
  ``set_abort_on_exception(False)``.
"""
import os
import sys
import traceback

import numpy

from minichain.dist import mpi
from minichain.dist.failures import partial_grads_error  # noqa: F401
from minichain.dist.guards import watchdog
from minichain.dist.packing import param_layout  # noqa: F401 - public here
from minichain.dist.guards.agreement import (  # noqa: F401 - also public here
    CollectiveMismatchError, Failure, attempt, by_rank, format_ranks, header,
    layout_hash)

ENV_NO_ABORT = 'MINICHAIN_NO_ABORT'
_MAX_ROWS = 30
_state = {'enabled': None, 'installed': False, 'previous': None}


class ModelMismatchError(ValueError):
    """The ranks hold different models (raised on every rank)."""


# -- abort on an uncaught exception -------------------------------------------
def set_abort_on_exception(enabled):
    """Turn the abort-on-uncaught-exception hook on or off for this process.

    Overrides the ``MINICHAIN_NO_ABORT`` environment variable.
    """
    _state['enabled'] = bool(enabled)


def abort_on_exception_enabled():
    """Whether an uncaught exception aborts the whole MPI job."""
    if _state['enabled'] is not None:
        return _state['enabled']
    return os.environ.get(ENV_NO_ABORT, '').strip().lower() in (
        '', '0', 'false', 'no')


def install_abort_hook():
    """Install the abort hook as ``sys.excepthook`` (once per process).

    Called by every communicator's constructor; a no-op after the first call.
    """
    if _state['installed']:
        return
    _state['previous'] = sys.excepthook
    sys.excepthook = _abort_hook
    _state['installed'] = True


def _abort_hook(exc_type, exc, tb):
    previous = _state['previous'] or sys.__excepthook__
    watchdog.note_uncaught(exc_type)
    if not abort_on_exception_enabled():
        return previous(exc_type, exc, tb)
    MPI = mpi.import_mpi()
    if MPI.Is_finalized() or MPI.COMM_WORLD.size == 1:
        return previous(exc_type, exc, tb)
    prefix = '[rank {}] '.format(MPI.COMM_WORLD.rank)
    text = ''.join(traceback.format_exception(exc_type, exc, tb))
    text += ('uncaught exception: aborting the MPI job so that the other ranks '
             'do not hang (set {}=1 or call minichain.dist.guards.safety.'
             'set_abort_on_exception(False) to turn this off)\n'
             .format(ENV_NO_ABORT))
    try:
        sys.stdout.flush()
        sys.stderr.write(''.join(prefix + line
                                 for line in text.splitlines(True)))
    finally:
        watchdog.abort(1)


# -- same-model check ---------------------------------------------------------
def persistent_layout(named_persistents):
    """``[(path, shape, dtype name)]`` of persistent values (scalars: shape
    ``'scalar'`` and the Python type name)."""
    out = []
    for name, v in named_persistents:
        if hasattr(v, 'shape') and hasattr(v, 'dtype'):
            out.append((name, tuple(v.shape), numpy.dtype(v.dtype).str))
        else:
            out.append((name, 'scalar', type(v).__name__))
    return out


def agree(wire, layout, where, count=0, step=None, maxes=()):
    """Inside a collective of ``wire``: its header, agreeing on ``layout``
    (and the training ``step``, when given). Returns the max over ranks of
    ``count`` followed by ``maxes``.

    Raises:
        ModelMismatchError: on every rank, with a table of the differences.
        CollectiveMismatchError: the ranks are at different steps.
    """
    # A tuple, so that the header hashes a model's layout once (see
    # agreement.layout_hash), not at every step.
    combined, _ = header(wire, tuple(layout), _differ(where),
                         maxes=(count,) + tuple(maxes), step=step)
    return combined


def _differ(where):
    """The header's ``on_mismatch`` for a model's layout."""
    return lambda layouts: ModelMismatchError(mismatch_message(where,
                                                               layouts))


_MEAN_GRAD_DIFFERS = _differ('multi_node_mean_grad')


def check_same_model(comm, model):
    """Raise :class:`ModelMismatchError` on every rank unless all ranks hold
    models with the same parameter names, shapes and dtypes.

    Args:
        comm: a minichain.dist communicator.
        model: a Link.
    """
    with comm.collective('check_same_model'):
        comm.header(param_layout(model.namedparams()),
                    lambda layouts: ModelMismatchError(mismatch_message(
                        'check_same_model', layouts)))


def _describe(entry):
    if entry is None:
        return '-'
    _, shape, dtype = entry
    if shape is None:
        return 'uninitialized'
    if shape == 'scalar':
        return 'scalar ' + dtype
    if shape == 'tag':
        return dtype
    return '{} {}'.format(tuple(shape), numpy.dtype(dtype).name)


def mismatch_message(where, layouts):
    """The error text for differing layouts (one list per rank)."""
    groups = {}
    for rank, layout in enumerate(layouts):
        groups.setdefault(tuple(tuple(e) for e in layout), []).append(rank)
    variants = list(groups.items())
    by_name = [{e[0]: e for e in layout} for layout, _ in variants]
    names = sorted(set().union(*by_name))
    rows = []
    for name in names:
        cells = [_describe(d.get(name)) for d in by_name]
        if len(set(cells)) > 1:
            rows.append([name] + cells)
    if not rows:  # same entries, different order
        rows = [['(order)'] + [', '.join(e[0] for e in layout[:4]) + ', ...'
                               for layout, _ in variants]]
    header = ['parameter'] + [format_ranks(r) for _, r in variants]
    shown = rows[:_MAX_ROWS]
    widths = [max(len(row[i]) for row in [header] + shown)
              for i in range(len(header))]
    lines = ['  ' + '  '.join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
             for row in [header] + shown]
    if len(rows) > len(shown):
        lines.append('  ... and {} more'.format(len(rows) - len(shown)))
    return ('{}: the model differs between ranks ({} of {} entries differ); '
            'every rank must build the same model (same parameter paths, '
            'shapes and dtypes):\n{}'.format(
                where, len(rows), len(names), '\n'.join(lines)))


def plan_grads(wire, named_params, zero_fill, extra=(), step=None,
               active=None):
    """Check the layout and the missing gradients; return what to allreduce.

    Called inside a collective of ``wire`` (its header). ``extra`` entries
    ``(label, 'tag', text)`` join the compared layout (a communicator adds
    e.g. where its arrays live); ``step`` (the optimizer's update count)
    must be equal too. ``active`` (True or False, inside
    :func:`minichain.dist.join`) says whether this rank still has data; a
    rank that has not contributes zeros.

    Returns ``(entries, n_active)``: ``entries`` = ``[(path, param,
    grad_or_None)]`` for the initialized parameters whose gradient exists on
    at least one rank (a gradient missing on every rank stays missing; None
    means "contribute zeros"); ``n_active`` the number of ranks with data
    (the size outside ``join``; 0, with no entries, once every rank ran out).

    Raises:
        ModelMismatchError: the layouts differ (on every rank).
        CollectiveMismatchError: the ranks are at different steps.
        ValueError: without ``zero_fill``, some gradient exists on some
            ranks only (on every rank, naming the parameters and ranks).
    """
    # One pass for what to average and the layout (param_layout's entries):
    # at 4 KB of gradients this Python is most of what the guards cost.
    entries, layout, n_missing = [], [], 0
    for name, p in named_params:
        a = p.array
        if a is None:
            layout.append((name, None, None))
            continue
        layout.append((name, a.shape, a.dtype))
        g = p.grad
        entries.append((name, p, g))
        n_missing += g is None
    flags = () if active is None else (int(not active), int(bool(active)))
    layout += extra
    # agree()'s header, called here: at 4 KB every call counts
    (n_missing, *joined), _ = header(wire, tuple(layout), _MEAN_GRAD_DIFFERS,
                                     maxes=(n_missing,) + flags, step=step)
    n_active = wire.size
    MPI = mpi.import_mpi()
    if joined and joined[0]:  # some rank ran out of data: count the others
        if not joined[1]:
            return [], 0
        count = numpy.array([int(bool(active))], numpy.int64)
        wire.Allreduce(MPI.IN_PLACE, count, op=MPI.SUM)
        n_active, zero_fill = int(count[0]), True
    if not n_missing:
        return entries, n_active
    missing = numpy.array([g is None for _, _, g in entries], dtype=bool)
    v = numpy.concatenate([missing, ~missing]).astype(numpy.int64)
    wire.Allreduce(MPI.IN_PLACE, v, op=MPI.MIN)
    everywhere = v[:len(entries)] > 0
    nowhere = v[len(entries):] > 0
    partial = ~everywhere & ~nowhere
    if partial.any() and not zero_fill:
        raise partial_grads_error(wire, [n for n, _, _ in entries],
                                  missing, partial)
    return [entry for entry, e in zip(entries, everywhere) if not e], \
        n_active
