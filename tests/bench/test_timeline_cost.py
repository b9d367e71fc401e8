"""bench/timeline_cost.py: one quick run prints its rows (no time is
asserted)."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_quick_run_prints_every_row():
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'timeline_cost.py'), '--quick'],
        capture_output=True, text=True, check=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout
    for name in ('if rec', 'span off', 'span on'):
        assert any(line.startswith(name) for line in out.splitlines()), out
    assert 'one flat ResNet-50 step: 54 spans' in out, out
