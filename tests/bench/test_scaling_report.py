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


def test_ceiling_rounds_and_what_averaging_costs(capsys):
    # The ceiling (2 ranks, no averaging) gets 1.96x, 1.9x, 2.0x one rank.
    history = [{1: 10.0, 2: 19.0, 'ceiling': 19.6},
               {1: 5.0, 2: 9.0, 'ceiling': 9.5},
               {1: 10.0, 2: 20.0, 'ceiling': 20.0}]
    scaling.report_rounds([1, 2], history)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ('ceiling (2 ranks, no averaging), round by round: '
                      '98.0%, 95.0%, 100.0% (median 98.0%, 95.0%-100.0%)')
    assert out[2] == ('what the averaging costs, round by round: 3.0 pt, '
                      '5.0 pt, 0.0 pt (median 3.0 pt, 0.0 pt-5.0 pt)')


def test_report_prints_the_ceiling_against_the_efficiency(capsys):
    def row(n, step):
        return {'n': n, 'step': step, 'cpu': step, 'img_s': n * 8 / step,
                'wait': 0.0, 'mean': 0.0, 'bus_GBps': 0.0, 'rss_mib': 1.0,
                'grad_bytes': 4, 'load': 0.0}
    rows = [row(1, 2.0), row(2, 2.2)]  # 2 / 2.2: 90.9%
    scaling.report(None, rows, None, ceiling=row(2, 2.1))  # 95.2%
    out = capsys.readouterr().out
    assert ('ceiling: 95.2% for the same 2 ranks without the gradient '
            'averaging (2.100 s/step): what 2 busy cores allow here; the '
            'averaging costs 4.3 points') in out


def test_overlap_report_compares_exposed_communication(capsys):
    rows = [{'n': 1, 'img_s': 4.0, 'mean': 0.0, 'wait': 0.0},
            {'n': 2, 'img_s': 7.6, 'mean': 0.08, 'wait': 0.02}]
    ovl = [{'name': '2+poll', 'n': 2, 'img_s': 7.8, 'mean': 0.03,
            'wait': 0.02, 'buckets': 5}]
    scaling.report_overlap(rows, ovl)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith('exposed communication per step at 2 ranks, '
                             'not overlapped: 100.0 ms (80.0 ms averaging')
    assert out[1] == ('exposed communication per step, 2+poll: 50.0 ms '
                      '(30.0 ms in the hooks during backward, packing and '
                      'posting 5 buckets, + 20.0 ms after backward, waiting '
                      'for the last ones and unpacking); 0.50x the not '
                      'overlapped; efficiency 97.5%')
