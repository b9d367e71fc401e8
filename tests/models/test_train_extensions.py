"""models/train_extensions.py: the progress line, stop signals and the
snapshot schedule of the training scripts."""
import argparse
import os
import signal
import subprocess
import sys
import time
import types

import numpy
import pytest

from models.train_extensions import (Progress, PrunePeriodic,
                                     SnapshotSchedule, extend_snapshots,
                                     snapshot_interval)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def _trainer(iteration, loss, acc):
    updater = types.SimpleNamespace(iteration=iteration, epoch_detail=0.5,
                                    images_per_update=64, recent=[0.5, 1.5])
    return types.SimpleNamespace(
        updater=updater,
        observation={'main/loss': numpy.float32(loss),
                     'main/accuracy': numpy.asarray(acc, numpy.float32)})


def test_line_every_interval_with_smoothed_values(capsys):
    p = Progress(total=20, interval=2)
    p._tqdm = None  # the plain-text path
    p(_trainer(1, 2.0, 0.5))
    assert capsys.readouterr().out == ''  # not an interval: nothing read
    p(_trainer(2, 1.0, 1.0))
    # exponential smoothing: 0.9 * 2.0 + 0.1 * 1.0, 0.9 * 0.5 + 0.1 * 1.0;
    # 64 images x 2 updates in 2.0 s
    assert capsys.readouterr().out == (
        'iteration 2/20 epoch 0.50 loss 1.900 acc 0.550 64.0 img/s\n')


def test_smoothed_values_stay_arrays_until_printed():
    # On the GPU a float() of a device scalar waits for the device: the
    # smoothing must keep array values and convert only for the text.
    p = Progress(total=20, interval=10)
    p._tqdm = None
    p(_trainer(1, 2.0, 0.5))
    p(_trainer(2, 1.0, 1.0))
    assert all(isinstance(v, (numpy.ndarray, numpy.generic))
               for v in p.smooth.values())


# -- stop signals ------------------------------------------------------------
def test_repeated_stop_signal_is_one_request_and_ctrl_c_again_quits():
    code = ('import os, signal\n'
            'from models import train_extensions as t\n'
            't.catch_signals()\n'
            'for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGTERM):\n'
            '    os.kill(os.getpid(), s)\n'
            'print(t._caught["signum"] == signal.SIGUSR1, flush=True)\n'
            'os.kill(os.getpid(), signal.SIGINT)\n'
            'print("still alive")\n')
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout == 'True\n', proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGINT


def test_stop_signal_repeated_after_the_window_ends_the_process():
    code = ('import os, signal, time\n'
            'from models import train_extensions as t\n'
            't.catch_signals()\n'
            'os.kill(os.getpid(), signal.SIGTERM)\n'
            'print("noted", flush=True)\n'
            'time.sleep(t.REPEAT_WINDOW + 0.3)\n'
            'os.kill(os.getpid(), signal.SIGTERM)\n'
            'print("still alive")\n')
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout == 'noted\n', proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGTERM


# -- --snapshot-every --------------------------------------------------------
@pytest.mark.parametrize('text, expected', [
    ('500', (500, 'iteration')), ('7i', (7, 'iteration')),
    ('90s', (90.0, 'second')), ('30m', (1800.0, 'second')),
    ('1.5h', (5400.0, 'second')), (' 2M ', (120.0, 'second'))])
def test_snapshot_interval(text, expected):
    assert snapshot_interval(text) == expected


@pytest.mark.parametrize('text', ['0', '-3', '2.5', 'm', '10x', '5mi', ''])
def test_snapshot_interval_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError, match='expected a whole '
                       'number of iterations'):
        snapshot_interval(text)


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


def test_schedule_every_seconds_follows_rank_0(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, 'monotonic', lambda: clock[0])
    comm = _Comm()
    schedule = SnapshotSchedule(None, (60.0, 'second'), comm)
    fired = []
    for i in range(1, 9):
        if schedule(_at(i)):
            fired.append(i)
        clock[0] += 25.0
    # counted from the first iteration's end: due at 160 s (iteration 4:
    # 175 s) and then at 235 s (iteration 7: 250 s)
    assert fired == [4, 7] and comm.bcasts == 8


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
