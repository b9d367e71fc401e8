"""bench/kernel_value.py: the step with each kernel taken out, in rounds."""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_prints_a_row_per_kernel_the_step_meets():
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'kernel_value.py'), '--batch',
         '2', '--size', '28', '--stem', 'small2', '--threads', '1',
         '--rounds', '1', '--warmup', '0'], capture_output=True, text=True,
        timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = dict(re.findall(r'^(\S.*?)\s+[\d.]+ s\s+([\d.]+)x', out.stdout,
                           re.M))
    assert rows['all kernels'] == '1.00', out.stdout
    for name in ('Convolution2D', 'BatchNormalization', 'MatMul'):
        assert 'without ' + name in rows, out.stdout
    assert 'without MaxPooling2D' not in rows  # small2 has no max pooling
    assert 'bodies only' in rows, out.stdout
