"""bench/_interleave.py: live workers taking turns, over real processes
(and a real two-rank mpiexec job through bench/scaling.py)."""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / 'bench'))
import _interleave  # noqa: E402

# A worker whose step takes ``PAUSE`` seconds, counts its calls and reports
# the count at the end; MODE=crash fails the second step, MODE=hang sleeps.
WORKER = textwrap.dedent('''
    import os, sys, time
    sys.path.insert(0, {bench!r})
    import _interleave
    mode, calls = os.environ.get('MODE', ''), []

    def step():
        calls.append(1)
        if mode == 'crash' and len(calls) == 2:
            raise RuntimeError('step two broke')
        if mode == 'hang' and len(calls) == 2:
            time.sleep(60)
        time.sleep(float(os.environ.get('PAUSE', '0.01')))
        return 0.5 * len(calls)

    print('a log line the driver skips', flush=True)
    _interleave.serve(step, 1, lambda: {{'calls': len(calls)}})
''')


@pytest.fixture
def script(tmp_path):
    path = tmp_path / 'worker.py'
    path.write_text(WORKER.format(bench=str(ROOT / 'bench')))
    return path


def _worker(name, script, timeout=60, **env):
    return _interleave.Worker(name, [sys.executable, str(script)],
                              env=dict(os.environ, **env), timeout=timeout)


def test_workers_take_turns_and_report(script):
    a, b = _worker('a', script), _worker('b', script, PAUSE='0.02')
    with a, b:
        rounds = _interleave.take_turns([a, b], 3, gap=0.0)
        # the warm-up step is call 1: the timed ones are 2, 3, 4
        assert rounds == [{'a': 1.0, 'b': 1.0}, {'a': 1.5, 'b': 1.5},
                          {'a': 2.0, 'b': 2.0}]
        assert a.finish() == {'calls': 4}
        assert b.finish() == {'calls': 4}
    assert a.proc.poll() == 0 and b.proc.poll() == 0


def test_a_crashing_worker_raises_with_its_stderr(script):
    with _worker('crasher', script, MODE='crash') as w:
        with pytest.raises(_interleave.WorkerError,
                           match='crasher exited with code 1 before TIME'
                                 '(.|\n)*step two broke'):
            w.step()


def test_a_hanging_worker_is_killed_at_the_timeout(script):
    w = _worker('sleeper', script, MODE='hang', timeout=1.0)
    with pytest.raises(_interleave.WorkerError,
                       match='sleeper: no TIME within 1.0 s'):
        w.step()
    assert w.proc.poll() is not None  # killed, not left running


def test_serve_rejects_an_unknown_command(script):
    with _worker('w', script) as w:
        w._send('jump')
        with pytest.raises(_interleave.WorkerError,
                           match="unknown command 'jump'"):
            w._expect('TIME')


def test_scaling_runs_two_ranks_in_turns():
    # the whole driver: a one-rank and a two-rank mpiexec job as workers
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'scaling.py'), '--arch',
         'resnet18', '--size', '16', '--stem', 'small', '--batch', '2',
         '--steps', '2', '--warmup', '1', '--no-torch', '--overlap',
         '--bucket-mb', '0.5'],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    rows = [ln.split() for ln in lines if ln.split()[:1] in (['1'], ['2'])]
    assert [r[0] for r in rows] == ['1', '2']
    eff = [ln for ln in lines if ln.startswith('efficiency at 2 ranks, round')]
    # two rounds, then the median and range
    assert len(eff) == 1 and re.fullmatch(
        r'efficiency at 2 ranks, round by round: [0-9.]+%, [0-9.]+% '
        r'\(median [0-9.]+%, [0-9.]+%-[0-9.]+%\)', eff[0]), eff
    # the overlapped job, in the same rounds
    assert any(ln.startswith('efficiency at 2+nodes, round by round: ')
               for ln in lines), out.stdout
    exposed = [ln for ln in lines if ln.startswith('exposed communication')]
    assert len(exposed) == 2 and 'not overlapped' in exposed[0], exposed
    assert re.search(r'2\+nodes: [0-9.]+ ms .* posting [0-9]+ buckets',
                     exposed[1]), exposed


def test_resnet50_step_one_framework():
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'resnet50_step.py'),
         '--config', '2x16:small', '--only', 'minichain', '--steps', '2',
         '--warmup', '1', '--gap', '0', '--threads', '1'],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith('1 thread(s) per framework')
    row = out.stdout.splitlines()[-1].split()
    assert row[:3] == ['minichain', '2', '16']
    assert float(row[3]) > 0 and float(row[-1]) > 0  # s/step, RSS MiB


def test_resnet50_step_bf16_pair():
    # --bf16: minichain with MINICHAIN_FP32_MATH=bf16 takes the same turns
    # (PyTorch's autocast worker too where torch is importable)
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'resnet50_step.py'),
         '--config', '2x16:small', '--only', 'minichain', '--bf16',
         '--steps', '1', '--warmup', '1', '--gap', '0', '--threads', '1'],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split()[0] for line in out.stdout.splitlines()[2:4]]
    assert rows == ['minichain', 'bf16'], out.stdout
    assert 'ratio minichain bf16/minichain float32 at batch 2 / 16 px' in \
        out.stdout


def test_resnet50_step_mixed16_worker():
    # --mixed16: minichain under config.dtype 'mixed16' takes the same
    # turns, against the bf16 worker where it runs
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'resnet50_step.py'),
         '--config', '2x16:small', '--only', 'minichain', '--bf16',
         '--mixed16', '--steps', '1', '--warmup', '1', '--gap', '0',
         '--threads', '1'],
        capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split()[0] for line in out.stdout.splitlines()[2:5]]
    assert rows == ['minichain', 'bf16', 'mixed16'], out.stdout
    assert 'ratio minichain mixed16/minichain bf16 at batch 2 / 16 px' in \
        out.stdout


def test_resnet50_step_rejects_a_bad_config():
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'resnet50_step.py'),
         '--config', '8x224'], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert 'resnet50_step: --config wants BATCHxSIZE:STEM' in out.stderr


class _Fake:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def step(self):
        self.log.append(self.name)
        return 1.0


def test_rounds_rotate_who_steps_first():
    log = []
    ws = [_Fake(n, log) for n in 'abc']
    rounds = _interleave.take_turns(ws, 4, gap=0.0)
    assert log == list('abc' 'bca' 'cab' 'abc')
    assert rounds == [{'a': 1.0, 'b': 1.0, 'c': 1.0}] * 4


def test_a_fixed_order_on_request():
    log = []
    ws = [_Fake(n, log) for n in 'ab']
    _interleave.take_turns(ws, 2, gap=0.0, rotate=False)
    assert log == list('abab')
