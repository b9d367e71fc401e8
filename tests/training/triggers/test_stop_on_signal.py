"""catch_stop_signals and StopOnSignal: a stop signal is noted, training
stops at the next iteration (on every rank together), a second request
ends the process."""
import os
import signal
import subprocess
import sys
import types

from minichain.training.triggers import StopOnSignal, stop_on_signal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
MODULE = 'from minichain.training.triggers import stop_on_signal as t\n'


def _python(code):
    return subprocess.run([sys.executable, '-c', MODULE + code], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_repeated_stop_signal_is_one_request_and_ctrl_c_again_quits():
    proc = _python('import os, signal\n'
                   't.catch_stop_signals()\n'
                   'for s in (signal.SIGUSR1, signal.SIGTERM, '
                   'signal.SIGTERM):\n'
                   '    os.kill(os.getpid(), s)\n'
                   'print(t._caught["signum"] == signal.SIGUSR1, flush=True)\n'
                   'os.kill(os.getpid(), signal.SIGINT)\n'
                   'print("still alive")\n')
    assert proc.stdout == 'True\n', proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGINT


def test_stop_signal_repeated_after_the_window_ends_the_process():
    proc = _python('import os, signal, time\n'
                   't.catch_stop_signals()\n'
                   'os.kill(os.getpid(), signal.SIGTERM)\n'
                   'print("noted", flush=True)\n'
                   'time.sleep(t.REPEAT_WINDOW + 0.3)\n'
                   'os.kill(os.getpid(), signal.SIGTERM)\n'
                   'print("still alive")\n')
    assert proc.stdout == 'noted\n', proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGTERM


class _Comm:
    """Another rank noted ``theirs``: the allreduce's max is the answer."""

    def __init__(self, theirs):
        self.theirs, self.calls = theirs, 0

    def allreduce_obj(self, value, op):
        assert op == 'max'
        self.calls += 1
        return max(value, self.theirs)


def _at(iteration):
    return types.SimpleNamespace(updater=types.SimpleNamespace(
        iteration=iteration, epoch_detail=iteration / 4,
        previous_epoch_detail=(iteration - 1) / 4))


def test_trigger_stops_on_the_base_or_on_any_ranks_signal(monkeypatch):
    monkeypatch.setitem(stop_on_signal._caught, 'signum', 0)
    alone = StopOnSignal((3, 'iteration'))
    assert [alone(_at(i)) for i in (1, 2, 3)] == [False, False, True]
    assert alone.signum == 0
    assert alone.get_training_length() == (3, 'iteration')
    comm = _Comm(theirs=signal.SIGUSR1)  # only another rank got it
    stop = StopOnSignal((1, 'epoch'), comm)
    assert stop(_at(1)) and stop.signum == signal.SIGUSR1
    assert comm.calls == 1
    monkeypatch.setitem(stop_on_signal._caught, 'signum', signal.SIGTERM)
    assert alone(_at(1)) and alone.signum == signal.SIGTERM
