"""bench/scaling.py: the per-round summary (efficiency and ratio medians)."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    'scaling', ROOT / 'bench' / 'scaling.py')
scaling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scaling)


def test_each_round_pairs_its_own_steps(capsys):
    # Round 1: 2 ranks give 1.9x one rank; round 2: 1.8x; round 3: 2.0x.
    history = [{1: 10.0, 2: 19.0, 'torch': 20.0},
               {1: 5.0, 2: 9.0, 'torch': 9.0},
               {1: 10.0, 2: 20.0, 'torch': 16.0}]
    scaling.report_rounds([1, 2], history)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ('efficiency at 2 ranks, round by round: 95.0%, '
                      '90.0%, 100.0% (median 95.0%, 90.0%-100.0%)')
    assert out[1] == ('ratio minichain (2 ranks) / PyTorch, round by '
                      'round: 0.95x, 1.00x, 1.25x (median 1.00x, '
                      '0.95x-1.25x)')


def test_no_torch_line_without_pytorch(capsys):
    scaling.report_rounds([1, 2], [{1: 1.0, 2: 2.0}, {1: 1.0, 2: 1.5}])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].endswith('(median 87.5%, 75.0%-100.0%)')
