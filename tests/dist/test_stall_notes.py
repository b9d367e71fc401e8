"""The watchdog's verdicts from notes, without MPI (the whole watchdog runs
under mpiexec in test_watchdog.py)."""
import types

from minichain.dist.guards import stall_notes

NOTICE = 1.0


def note(state, seq, collective=True, peer=None, **kw):
    return dict(state=state, seq=seq, collective=collective, peer=peer,
                what='allreduce #{}'.format(seq), **kw)


def test_a_rank_that_left_before_the_collective_ends_the_wait_at_once():
    mine = note('waiting', 3)
    found = stall_notes.verdict(mine, {1: note('left', 2, False,
                                                reason='x')}, 0, NOTICE)
    assert found == ('rank 1 will never join collective #3: it left before',
                     0.0)
    # Left after joining it: the collective may still complete.
    assert stall_notes.verdict(mine, {1: note('left', 3, False,
                                               reason='x')}, 0, NOTICE) is None


def test_a_message_from_a_rank_that_left_never_comes():
    mine = note('waiting', 2, collective=False, peer=1)
    found = stall_notes.verdict(mine, {1: note('left', 5, False,
                                                reason='x')}, 0, NOTICE)
    assert found == ('rank 1 left without sending what rank 0 waits for',
                     2 * NOTICE)
    assert stall_notes.verdict(mine, {2: note('left', 5, False,
                                               reason='x')}, 0, NOTICE) is None


def test_ranks_waiting_for_each_other_and_ranks_in_the_same_collective():
    mine = note('waiting', 2, collective=False, peer=1)
    other = note('waiting', 2, collective=True)
    assert stall_notes.verdict(mine, {1: other}, 0, NOTICE) == (
        'ranks 0 and 1 wait for each other: neither can go on', 2 * NOTICE)
    same = note('waiting', 2)
    assert stall_notes.verdict(same, {1: same}, 0, NOTICE) is None


def test_a_rank_waiting_on_a_sibling_communicator_for_this_one():
    """Overlapped buckets: rank 1 waits in the buckets' communicator for a
    collective rank 0 has not begun, while rank 0 waits here."""
    mine = note('waiting', 5)
    there = dict(note('waiting', 2, waited=1.5, received=0.0),
                 wire='flat buckets', begun=False)
    found = stall_notes.verdict(mine, {1: note('done', 5)}, 0, NOTICE,
                                 {1: there})
    assert found == ('ranks 0 and 1 wait for each other: rank 1 waits in '
                     'allreduce #2 (collective #2 of the flat buckets '
                     'communicator), which rank 0 has not begun, while it '
                     'waits here', 2 * NOTICE)
    # rank 0 has begun it (posted, in flight): it completes as MPI
    # progresses, so no verdict
    begun = dict(there, begun=True)
    assert stall_notes.verdict(mine, {}, 0, NOTICE, {1: begun}) is None
    # its note here (waiting in collective #4) is older than the one from
    # the sibling: it waits there now, not here
    assert stall_notes.verdict(mine, {1: note('waiting', 4)}, 0, NOTICE,
                                {1: begun}) is None
    wire = types.SimpleNamespace(rank=0, size=2, label='flat', timeout=60.0,
                                 joined=4, waiting=mine, peers={},
                                 elsewhere={1: there})
    lines = stall_notes.report(wire, 3.0, found[0])
    assert lines[1].startswith('rank 1: waiting for ')
    assert lines[1].endswith(' s in allreduce #2 (collective #2 of the flat '
                             'buckets communicator)')


def test_a_higher_rank_lets_a_lower_one_report_first():
    mine = note('waiting', 4)
    peers = {0: note('waiting', 4, waited=1.0)}
    assert stall_notes.defer(mine, peers, 1, NOTICE) == 2 * NOTICE
    assert stall_notes.defer(mine, peers, 0, NOTICE) == 0.0
    assert stall_notes.defer(mine, {0: note('waiting', 3)}, 1, NOTICE) == 0.0


def test_report_names_every_rank_and_the_conclusion():
    wire = types.SimpleNamespace(
        rank=0, size=3, label='flat', timeout=60.0, joined=1,
        waiting=note('waiting', 2),
        peers={1: note('left', 1, False, reason='an uncaught KeyError')},
        elsewhere={})
    lines = stall_notes.report(wire, 5.0, None)
    assert lines[0] == ('rank 0 has waited 5.0 s in allreduce #2 (collective '
                        '#2 of the flat communicator over 3 ranks)')
    assert lines[1] == ('rank 1: left (an uncaught KeyError) after collective '
                        '#1 (allreduce #1)')
    assert lines[2].startswith('rank 2: no word from it: it joined '
                               'collective #1')
    assert lines[3] == 'so: no progress for 60 s, the stall timeout'
    assert len(lines) == 4  # an uncaught exception: no hint about data


def test_the_newest_note_of_each_rank_wins_across_communicators():
    here = {1: dict(note('done', 5), at=10.0), 2: dict(note('waiting', 5),
                                                         at=12.0)}
    buckets = types.SimpleNamespace(label='flat buckets', seq=1, peers={
        1: dict(note('waiting', 2), at=11.0),    # newer: it waits there
        2: dict(note('waiting', 1), at=3.0)})    # older: it waits here now
    found = stall_notes.newest_elsewhere(here, [buckets])
    assert list(found) == [1]
    assert found[1]['wire'] == 'flat buckets' and not found[1]['begun']
    buckets.peers[1] = dict(note('done', 2), at=11.5)  # done there: not
    assert stall_notes.newest_elsewhere(here, [buckets]) == {}
