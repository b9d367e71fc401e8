"""bench/graph_bytes.py: the arrays a ResNet forward leaves in the graph."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_graph_keeps_less_than_every_input():
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'graph_bytes.py'), '--config',
         '2x28:small2'], capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr[-3000:]
    row = out.stdout.splitlines()[-1].split()
    assert row[:5] == ['resnet50', '2', '28', 'small2', '111'], out.stdout
    every, kept = float(row[5]), float(row[6])
    # The projection shortcuts' normalized outputs feed the fused add of
    # the block's last batch normalization, which does not retain them, and
    # the pooled features feed a reshape: the graph lets those go.
    assert 0 < kept < every, out.stdout
