"""bench/resnet50_step.py --against: a second checkout's minichain takes
turns with this one's, and a bad checkout is refused."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / 'bench' / 'resnet50_step.py')


def _run(*args):
    return subprocess.run(
        [sys.executable, SCRIPT, '--only', 'minichain', '--config',
         '1x28:small2', '--steps', '2', '--warmup', '1', '--threads', '1',
         *args], capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_against_another_checkout_prints_its_ratio(tmp_path):
    other = tmp_path / 'before'
    shutil.copytree(ROOT / 'minichain', other / 'minichain',
                    ignore=shutil.ignore_patterns('__pycache__'))
    shutil.copytree(ROOT / 'models', other / 'models',
                    ignore=shutil.ignore_patterns('__pycache__', 'result'))
    out = _run('--against', str(other))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split()[0] for line in out.stdout.splitlines()
            if re.match(r'(minichain|before)\s+1\s+28\s', line)]
    assert rows == ['minichain', 'before'], out.stdout
    assert re.search(r'ratio minichain/before at batch 1 / 28 px: speed '
                     r'[\d.]+x \(median of 2 step pairs', out.stdout), \
        out.stdout


def test_against_a_folder_without_minichain_is_refused(tmp_path):
    out = _run('--against', str(tmp_path))
    assert out.returncode == 2
    assert '--against {}: no minichain/__init__.py there'.format(
        tmp_path) in out.stderr
