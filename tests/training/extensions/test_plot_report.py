import sys

import pytest

from minichain import iterators
from minichain.serializers import DictionarySerializer, NpzDeserializer
from minichain.training import extensions
from tests.training._util import make_data, make_trainer

pytest.importorskip('matplotlib')


def test_png_is_written_with_one_point_per_interval(tmp_path):
    plot = extensions.PlotReport(['main/loss', 'main/accuracy', 'absent'],
                                 x_key='iteration', trigger=(2, 'iteration'))
    trainer = make_trainer(tmp_path, stop=(4, 'iteration'))
    trainer.extend(plot)
    trainer.run()
    with open(str(tmp_path / 'plot.png'), 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert [x for x, _ in plot.data['main/loss']] == [2, 4]
    assert plot.data['absent'] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ['plot.png']
    saver = DictionarySerializer()
    plot.serialize(saver)
    other = extensions.PlotReport(['main/loss', 'main/accuracy', 'absent'])
    other.serialize(NpzDeserializer(saver.target))
    assert other.data == plot.data


def test_file_name_and_single_key(tmp_path):
    trainer = make_trainer(tmp_path, stop=(1, 'epoch'))
    trainer.extend(extensions.PlotReport('main/loss', file_name='loss.png'))
    trainer.run()
    assert (tmp_path / 'loss.png').stat().st_size > 0


def test_missing_matplotlib(monkeypatch):
    assert extensions.PlotReport.available()
    monkeypatch.setitem(sys.modules, 'matplotlib.figure', None)
    assert not extensions.PlotReport.available()
    with pytest.raises(ImportError, match='pip install matplotlib'):
        extensions.PlotReport(['main/loss'])


def test_call_before_training_plots_the_untrained_model(tmp_path):
    trainer = make_trainer(tmp_path, stop=(2, 'epoch'))
    model = trainer.updater.get_optimizer().target
    test_iter = iterators.SerialIterator(make_data(10, seed=1), 5,
                                         repeat=False, shuffle=False)
    trainer.extend(extensions.Evaluator(test_iter, model),
                   call_before_training=True)
    plot = extensions.PlotReport(['main/loss', 'validation/main/loss'])
    trainer.extend(plot, call_before_training=True)
    trainer.run()
    assert [x for x, _ in plot.data['validation/main/loss']] == [0, 1, 2]
    assert [x for x, _ in plot.data['main/loss']] == [1, 2]
