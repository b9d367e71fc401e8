"""What a waiting rank makes of the other ranks' notes (the stall watchdog,
:mod:`minichain.dist.guards.watchdog`): whether its wait can still complete, and
the lines it prints when it ends the job.

A note is a dict: ``state`` (``'waiting'``, ``'done'`` or ``'left'``),
``seq`` (the collectives its rank had begun), ``what`` (what it waits for,
in words), ``collective`` (it waits in a collective, not for one message),
``peer`` (the rank that message comes from or goes to, else None). A
waiting note adds ``waited`` (seconds, when sent) and ``received`` (when
read, on this rank's clock); a left note adds ``reason``.
"""
import time


def defer(mine, peers, rank, notice):
    """Seconds to wait longer before giving up: when a lower rank waits in
    the same collective, it reports first (one report per job rather than
    one per rank)."""
    for r, note in peers.items():
        if (r < rank and note['state'] == 'waiting'
                and note['collective'] and mine['collective']
                and note['seq'] == mine['seq']):
            return 2 * notice
    return 0.0


def newest_elsewhere(peers, siblings):
    """The ranks whose newest note (by the sender's clock, ``at``) came
    from another communicator over the same ranks (``siblings``: Wires)
    and says they wait there: rank -> that note, with ``wire`` (the
    sibling's label) and ``begun`` (whether this rank has begun that
    collective there). A rank that waits on another communicator, in a
    collective this rank has not begun, waits for this rank as surely as
    one that waits here."""
    newest = {r: (note, None) for r, note in peers.items()}
    for wire in siblings:
        for r, note in wire.peers.items():
            if r not in newest or note['at'] > newest[r][0]['at']:
                newest[r] = (note, wire)
    return {r: dict(note, wire=wire.label, begun=wire.seq >= note['seq'])
            for r, (note, wire) in newest.items()
            if wire is not None and note['state'] == 'waiting'}


def verdict(mine, peers, rank, notice, elsewhere=None):
    """``(conclusion, grace seconds)`` when the wait ``mine`` of ``rank``
    cannot complete, given the ``peers``' notes (and ``elsewhere``: their
    newer notes from the other communicators over the same ranks, from
    :func:`newest_elsewhere`); None while it may."""
    for r, note in sorted((elsewhere or {}).items()):
        # r waits on another communicator for a collective that this rank
        # has not begun and cannot begin while it waits here
        if (mine['collective'] and note['state'] == 'waiting'
                and note['collective'] and not note['begun']):
            return ('ranks {} and {} wait for each other: rank {} waits in '
                    '{} (collective #{} of the {} communicator), which rank '
                    '{} has not begun, while it waits here'.format(
                        *sorted((r, rank)), r, note['what'], note['seq'],
                        note['wire'], rank), 2 * notice)
    for r, note in sorted(peers.items()):
        if r in (elsewhere or {}):
            continue  # its newer note is about another communicator
        needed = mine['collective'] or mine['peer'] == r
        if note['state'] == 'left' and needed:
            if mine['collective'] and note['seq'] < mine['seq']:
                return ('rank {} will never join collective #{}: it left '
                        'before'.format(r, mine['seq']), 0.0)
            if not mine['collective']:
                return ('rank {} left without sending what rank {} waits '
                        'for'.format(r, rank), 2 * notice)
        if note['state'] != 'waiting' or not needed:
            continue
        same = (mine['collective'] and note['collective']
                and note['seq'] == mine['seq'])
        needs_me = note['collective'] or note['peer'] == rank
        if not same and needs_me:
            return ('ranks {} and {} wait for each other: neither can go '
                    'on'.format(*sorted((r, rank))), 2 * notice)
    return None


def report(wire, waited, conclusion):
    """The report of ``wire`` (a :class:`~minichain.dist.guards.watchdog.Wire`
    that gives up after ``waited`` seconds): its wait, what each other
    rank was last seen doing, the ``conclusion`` (None: the stall timeout)
    and a hint where one fits."""
    mine = wire.waiting
    where = ('collective #{} of the'.format(mine['seq'])
             if mine['collective'] else 'the')
    lines = ['rank {} has waited {:.1f} s {}{} ({} {} communicator over '
             '{} ranks)'.format(wire.rank, waited, 'in ' if mine[
                 'collective'] else 'to ', mine['what'], where,
                 wire.label, wire.size)]
    lines += [_peer_line(r, wire.elsewhere.get(r, wire.peers.get(r)),
                         wire.joined)
              for r in range(wire.size) if r != wire.rank]
    lines.append('so: ' + (conclusion or 'no progress for {:g} s, the stall '
                           'timeout'.format(wire.timeout)))
    return lines + _hints(mine['what'], wire.peers)


def warning(wire, waited):
    """One line for a rank still waiting after ``waited`` seconds: its
    wait, and each rank it waits for with what that rank was last seen
    doing (the ranks already waiting with it in the same collective are
    left out)."""
    mine = wire.waiting
    if mine['collective']:
        ranks = [r for r in range(wire.size) if r != wire.rank
                 and not _waits_with(wire.peers.get(r), mine)]
    else:
        ranks = [mine['peer']] if mine['peer'] is not None else []
    where = (' (collective #{} of the {} communicator)'.format(
        mine['seq'], wire.label) if mine['collective'] else '')
    return 'rank {} has waited {:.0f} s {}{}{}, for {}'.format(
        wire.rank, waited, 'in ' if mine['collective'] else 'to ',
        mine['what'], where, '; '.join(
            _peer_line(r, wire.elsewhere.get(r, wire.peers.get(r)),
                       wire.joined) for r in ranks) or 'no rank')


def _waits_with(note, mine):
    return (note is not None and note['state'] == 'waiting'
            and note['collective'] and note['seq'] == mine['seq'])


def _peer_line(r, note, joined):
    if note is None or note['state'] == 'done':
        seen = ('it joined collective #{} with the others'.format(joined)
                if joined else 'it joined no collective of this '
                'communicator yet')
        return ('rank {}: no word from it: {}, and has waited in none '
                'since (it is busy elsewhere, or stopped)'.format(r, seen))
    if note['state'] == 'left':
        return 'rank {}: left ({}) {}'.format(r, note['reason'], (
            'after collective #{} ({})'.format(note['seq'], note['what'])
            if note['seq'] else 'before any collective'))
    waited = note['waited'] + time.monotonic() - note['received']
    where = ' of the {} communicator'.format(note['wire']) if 'wire' in \
        note else ''
    return 'rank {}: waiting for {:.1f} s {}{}{}'.format(
        r, waited, 'in ' if note['collective'] else 'to ', note['what'],
        ' (collective #{}{})'.format(note['seq'], where) if note['collective']
        else where)


def _hints(what, peers):
    text = ' '.join([what] + [n['what'] for n in peers.values()])
    if any(n['state'] == 'left' and 'uncaught' not in n['reason']
           for n in peers.values()):
        return ['hint: when a rank runs out of data first, the others wait '
                'for it: scatter_dataset makes shards of equal length by '
                'default (force_equal_length=True), and minichain.dist.join '
                'lets ranks finish shards of different lengths']
    if 'multi_node_batch_normalization' in text:
        return ['hint: MultiNodeBatchNormalization communicates in training '
                'mode only: minichain.config.train must be the same on every '
                'rank']
    return []
