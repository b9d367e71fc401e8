"""Errors that every rank raises together, and how ranks are named in them.

A bad argument seen on one rank only (a wrong shape, a dataset that cannot
be read) must not leave the other ranks waiting: the rank that sees it
turns it into a :class:`Failure` (:func:`attempt`), the ranks exchange what
they hold in the collective they were about to make anyway, and every rank
raises the same error (:func:`raise_failures`). The guards' header
(guards/agreement.py) carries Failures in every collective; the bare
protocol raises a local one where it is found.
"""
import pickle

import numpy


class Failure:
    """A local error carried by the header to every rank (see
    :func:`attempt`)."""

    def __init__(self, error):
        self.type, self.text = type(error), str(error)
        try:  # it travels to the other ranks, by name
            pickle.loads(pickle.dumps(self.type))
        except Exception:  # noqa: BLE001 - e.g. a class local to a function
            self.type = RuntimeError
            self.text = '{}: {}'.format(type(error).__name__, self.text)

    def __repr__(self):
        return 'Failure({}: {})'.format(self.type.__name__, self.text)


def attempt(fn, *args):
    """``fn(*args)``, or a :class:`Failure` for a TypeError or ValueError,
    to be agreed on in the header (so that every rank raises it)."""
    try:
        return fn(*args)
    except (TypeError, ValueError) as e:
        return Failure(e)


def raise_failures(values):
    """Raise the first :class:`Failure` among every rank's ``values`` (its
    type, naming the ranks when there are several); return otherwise.

    The error has ``raised_on_every_rank = True``: the other ranks raise it
    too (so a handler need not tell them)."""
    failed = [(r, v) for r, v in enumerate(values) if isinstance(v, Failure)]
    if failed:
        rank, f = failed[0]
        where = '' if len(values) == 1 else ' (on {})'.format(
            format_ranks([r for r, _ in failed]))
        try:
            error = f.type(f.text + where)
        except Exception:  # noqa: BLE001 - a type that wants more arguments
            error = RuntimeError('{}: {}{}'.format(f.type.__name__, f.text,
                                                   where))
        error.raised_on_every_rank = True
        raise error


def by_rank(values, show=repr):
    """``'rank 0: a; ranks 1-3: b'``: ``values`` (one per rank) grouped."""
    groups = {}
    for rank, value in enumerate(values):
        groups.setdefault(show(value), []).append(rank)
    return '; '.join('{}: {}'.format(format_ranks(ranks), text)
                     for text, ranks in groups.items())


def format_ranks(ranks):
    """``[0, 2, 3, 4]`` -> ``'ranks 0, 2-4'``."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else
                         '{}-{}'.format(start, r))
            start = None
    return ('rank ' if len(ranks) == 1 else 'ranks ') + ', '.join(parts)


def partial_grads_error(wire, names, missing, partial):
    """The ValueError for gradients that are None on some ranks only
    (collective: gathers which ranks lack them). ``missing``: this rank's
    flags, ``partial``: the agreed ones, both aligned with ``names``."""
    ranks_missing = wire.allgather_obj(numpy.flatnonzero(missing))
    lines = []
    for i in numpy.flatnonzero(partial):
        ranks = [r for r, m in enumerate(ranks_missing) if i in m]
        lines.append('  {}: no gradient on {}'.format(names[i],
                                                      format_ranks(ranks)))
    return ValueError(
        'multi_node_mean_grad: some gradients are None on some ranks only '
        '(a branch of the model was not used there); pass zero_fill=True '
        'to average them as zeros:\n' + '\n'.join(lines))
