import json
import os

import pytest

from minichain.training import extensions
from tests.training._util import make_trainer


def _spy(losses):
    def spy(trainer):
        losses.append(float(trainer.observation['main/loss']))
    return spy


def test_log_file_holds_interval_means(tmp_path):
    losses = []
    log_report = extensions.LogReport()
    trainer = make_trainer(tmp_path, stop=(3, 'epoch'))
    trainer.extend(_spy(losses), name='spy')
    trainer.extend(log_report)
    trainer.run()
    assert os.listdir(str(tmp_path)) == ['log']  # no temporary file left
    with open(str(tmp_path / 'log')) as f:
        log = json.load(f)
    assert log == log_report.log
    assert [e['epoch'] for e in log] == [1, 2, 3]
    assert [e['iteration'] for e in log] == [5, 10, 15]
    assert set(log[0]) == {'main/loss', 'main/accuracy', 'epoch',
                           'iteration', 'elapsed_time'}
    assert log[0]['main/loss'] == pytest.approx(sum(losses[:5]) / 5)
    assert log[1]['main/loss'] == pytest.approx(sum(losses[5:10]) / 5)
    assert 0 < log[0]['elapsed_time'] <= log[2]['elapsed_time']


def test_keys_trigger_postprocess_and_no_file(tmp_path):
    def postprocess(entry):
        entry['double'] = 2 * entry['main/loss']

    log_report = extensions.LogReport(keys=['main/loss'],
                                      trigger=(2, 'iteration'),
                                      postprocess=postprocess, filename=None)
    trainer = make_trainer(tmp_path, stop=(5, 'iteration'))
    trainer.extend(log_report)
    trainer.run()
    assert [e['iteration'] for e in log_report.log] == [2, 4]
    entry = log_report.log[0]
    assert set(entry) == {'main/loss', 'double', 'epoch', 'iteration',
                          'elapsed_time'}
    assert entry['double'] == 2 * entry['main/loss']
    assert os.listdir(str(tmp_path)) == []


def test_custom_file_name(tmp_path):
    trainer = make_trainer(tmp_path, stop=(2, 'iteration'))
    trainer.extend(extensions.LogReport(trigger=(1, 'iteration'),
                                        filename='train.json'))
    trainer.run()
    with open(str(tmp_path / 'train.json')) as f:
        assert len(json.load(f)) == 2


def test_inf_and_nan_are_null_in_the_file(tmp_path):
    import math

    def poison(trainer):
        if trainer.updater.iteration > 5:
            trainer.observation['main/loss'] = float('nan')
            trainer.observation['huge'] = float('inf')
    log_report = extensions.LogReport()
    trainer = make_trainer(tmp_path, stop=(2, 'epoch'))
    trainer.extend(poison, name='poison', priority=250)
    trainer.extend(log_report)
    trainer.run()
    with open(str(tmp_path / 'log')) as f:
        text = f.read()
    assert 'NaN' not in text and 'Infinity' not in text
    log = json.loads(text)
    assert log[1]['main/loss'] is None and log[1]['huge'] is None
    assert isinstance(log[0]['main/loss'], float)
    assert math.isnan(log_report.log[1]['main/loss'])  # in memory: a float
