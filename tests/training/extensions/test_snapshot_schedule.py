"""parse_interval, SnapshotSchedule and extend_snapshots: snapshots every N
iterations or seconds between the kept ones, each replacing the last."""
import argparse
import time
import types

import pytest

from minichain.training.extensions import parse_interval
from minichain.training.extensions.snapshot_schedule import (
    PrunePeriodic, SnapshotSchedule, extend_snapshots)


@pytest.mark.parametrize('text, expected', [
    ('500', (500, 'iteration')), ('7i', (7, 'iteration')),
    ('90s', (90.0, 'second')), ('30m', (1800.0, 'second')),
    ('1.5h', (5400.0, 'second')), (' 2M ', (120.0, 'second'))])
def test_parse_interval(text, expected):
    assert parse_interval(text) == expected


@pytest.mark.parametrize('text', ['0', '-3', '2.5', 'm', '10x', '5mi', ''])
def test_parse_interval_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match='expected a whole '
                       'number of iterations'):
        parse_interval(text)


class _Comm:
    rank = 0

    def __init__(self):
        self.bcasts = 0

    def bcast_obj(self, obj, root=0):
        self.bcasts += 1
        return obj


def _at(iteration):
    """A trainer after ``iteration`` (6 iterations an epoch)."""
    return types.SimpleNamespace(updater=types.SimpleNamespace(
        iteration=iteration, epoch_detail=iteration / 6,
        previous_epoch_detail=(iteration - 1) / 6), out='')


def test_schedule_every_iterations_and_every_epoch():
    comm = _Comm()
    schedule = SnapshotSchedule((1, 'epoch'), (4, 'iteration'), comm)
    fired = [(i, schedule.periodic) for i in range(1, 13)
             if schedule(_at(i))]
    assert fired == [(4, True), (6, False), (8, True), (12, False)]
    assert comm.bcasts == 0  # iterations need no agreement
    never = SnapshotSchedule(None, None, comm)
    assert not any(never(_at(i)) for i in range(1, 13))


@pytest.mark.parametrize('with_comm', [True, False])
def test_schedule_every_seconds_follows_rank_0(monkeypatch, with_comm):
    clock = [100.0]
    monkeypatch.setattr(time, 'monotonic', lambda: clock[0])
    comm = _Comm()
    schedule = SnapshotSchedule(None, (60.0, 'second'),
                                comm if with_comm else None)
    fired = []
    for i in range(1, 9):
        if schedule(_at(i)):
            fired.append(i)
        clock[0] += 25.0
    # counted from the first iteration's end: due at 160 s (iteration 4:
    # 175 s) and then at 235 s (iteration 7: 250 s)
    assert fired == [4, 7] and comm.bcasts == (8 if with_comm else 0)


def test_prune_keeps_epochs_and_the_newest_periodic(tmp_path):
    comm = _Comm()
    schedule = SnapshotSchedule((1, 'epoch'), (2, 'iteration'), comm)
    snap = types.SimpleNamespace(last_iteration=None)
    prune = PrunePeriodic(schedule, snap, 'snap_{.updater.iteration}')
    for i in range(1, 10):
        trainer = _at(i)
        trainer.out = str(tmp_path)
        if schedule(trainer):
            (tmp_path / 'snap_{}'.format(i)).write_bytes(b'x')
            snap.last_iteration = i
        prune(trainer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['snap_6', 'snap_8']


def test_extend_snapshots_removes_what_a_killed_run_was_writing(tmp_path):
    gone = 4194305  # above Linux's largest pid: no such process
    names = ['.snap_6.{}.tmp'.format(gone),
             '..snap_6.{0}.tmp.{0}.ab12cd34.tmp'.format(gone), 'snap_3',
             '.snap_7.1.tmp',  # pid 1 runs: its write may go on
             '.other.tmp', 'log']
    for name in names:
        (tmp_path / name).write_bytes(b'x')
    extended = []
    trainer = types.SimpleNamespace(out=str(tmp_path), extend=lambda ext,
                                    **kw: extended.append(type(ext)))
    snap = types.SimpleNamespace(last_iteration=None)
    extend_snapshots(trainer, snap, 'snap_{.updater.iteration}', None,
                     (2, 'iteration'), _Comm())
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        '.other.tmp', '.snap_7.1.tmp', 'log', 'snap_3']
    assert extended == [types.SimpleNamespace, PrunePeriodic]


def test_one_process_run_keeps_epochs_and_the_newest_between(tmp_path):
    from minichain.training import extensions
    from tests.training._util import make_trainer
    trainer = make_trainer(tmp_path, stop=(12, 'iteration'))  # 4.8 an epoch
    name = 'snapshot_iter_{.updater.iteration}'
    snap = extensions.snapshot(filename=name)
    extend_snapshots(trainer, snap, name, (1, 'epoch'), (3, 'iteration'))
    trainer.run()
    # epochs end at 5 and 10, and stay; 3 went at 5, 6 at 9, 9 at 10
    assert sorted(p.name for p in tmp_path.iterdir()
                  if p.name.startswith('snapshot')) == [
        'snapshot_iter_10', 'snapshot_iter_12', 'snapshot_iter_5']
    assert snap.last_iteration == 12
