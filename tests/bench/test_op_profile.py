"""bench/op_profile.py: one profiled worker run, its op names and its sums."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_worker_accounts_for_the_whole_step():
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'op_profile.py'), '--worker',
         '--batch', '1', '--size', '32', '--steps', '1'],
        capture_output=True, text=True, check=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS='1'))
    prof = json.loads(out.stdout.strip().splitlines()[-1])
    # a convolution's forward, input gradient and weight gradient, each once
    for op in ('Convolution2D', 'Deconvolution2D', 'Convolution2DGradW',
               'BatchNormalization', 'BatchNormalizationGrad', 'ReLUGrad'):
        assert prof[op] > 0, op
    # outermost forwards only: the ops and "other" add up to the step
    ops = sum(v for k, v in prof.items() if k not in ('other', 'total'))
    assert prof['other'] >= 0
    assert ops + prof['other'] == pytest.approx(prof['total'])


def test_copies_in_lockstep_print_a_table():
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'op_profile.py'), '--batch',
         '1', '--size', '32', '--steps', '2', '--copies', '2', '--lockstep'],
        capture_output=True, text=True, check=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert 'the copies in lockstep' in out.stdout
    rows = {line.split()[0]: line.split()[1:] for line in
            out.stdout.splitlines()[2:] if line.strip()}
    assert float(rows['total'][0]) > 0 and float(rows['total'][1]) > 0


def test_one_process_with_threads_and_a_stem():
    out = subprocess.run(
        [sys.executable, str(ROOT / 'bench' / 'op_profile.py'), '--batch',
         '2', '--size', '28', '--stem', 'small2', '--threads', '2',
         '--steps', '1'],
        capture_output=True, text=True, check=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert 'small2 stem, 2 thread(s)' in out.stdout
    rows = {line.split()[0]: line.split()[1:] for line in
            out.stdout.splitlines()[2:] if line.strip()}
    assert len(rows['total']) == 1 and float(rows['total'][0]) > 0
