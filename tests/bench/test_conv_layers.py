"""bench/conv_layers.py: every convolution of the step, timed alone."""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_lists_every_layer_kind_with_its_count():
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'conv_layers.py'), '--batch',
         '2', '--size', '28', '--stem', 'small2', '--threads', '1',
         '--rounds', '1', '--no-torch'], capture_output=True, text=True,
        timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines()
            if re.match(r'\d+\s+\(2,', line)]
    # ResNet-50 runs 53 convolutions (the small2 stem's one included)
    assert sum(int(r[0]) for r in rows) == 53, out.stdout
    assert all(len(r) == 14 for r in rows), rows  # three times each
    total = re.search(r'per step, by kind \(ms\): (.*)', out.stdout)
    assert total, out.stdout
    for k in ('1x1 s1', '1x1 s2', '3x3 s1', '3x3 s2'):
        assert k in total.group(1), out.stdout
