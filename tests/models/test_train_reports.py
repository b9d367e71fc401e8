"""Rank 0's lines of the main job (models/train_reports.py)."""
import argparse
import types

from models import train_reports


def test_summary_names_images_accuracy_and_the_budget(capsys):
    trainer = types.SimpleNamespace(
        updater=types.SimpleNamespace(iteration=500, epoch_detail=1.0),
        elapsed_time=885.4)
    args = argparse.Namespace(out='result')
    result = {'validation/main/accuracy': 0.8637,
              'validation/main/loss': 0.3812}
    train_reports.print_end(trainer, args, 64, 10000, result)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        'done: 500 iterations, 32000 images (1.00 epochs) in 14 min 45 s',
        'test accuracy 0.8637 (loss 0.3812) over all 10000 validation images']
    train_reports.print_end(trainer, args, 64, 10000, result,
                             budget='time budget: 13 min')
    assert capsys.readouterr().out.splitlines()[0] == 'time budget: 13 min'
