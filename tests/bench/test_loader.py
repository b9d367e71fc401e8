"""bench/loader.py runs end to end on a tiny generated JPEG tree."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_loader_bench_prints_both_tables(tmp_path):
    pytest.importorskip('PIL')
    cmd = [sys.executable, str(ROOT / 'bench' / 'loader.py'), '--images',
           '12', '--dir', str(tmp_path / 'jpeg'), '--workers', '0,1',
           '--batch', '4', '--batches', '2', '--repeat', '1', '--steps', '1',
           '--step-config', '2x16:small2']
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert 'wrote 12 JPEGs of 500x375' in out
    assert len(list((tmp_path / 'jpeg' / 'train').glob('*/*.JPEG'))) == 12
    assert '1. loader alone' in out and 'one worker decodes' in out
    assert '2. beside a CPU step' in out
    rows = [line.split() for line in out.splitlines()
            if line.split()[:1] in (['0'], ['1'])]
    assert len(rows) == 4, out  # two workers counts in each table
    assert (tmp_path / 'jpeg' / 'complete').exists()  # kept for next time
