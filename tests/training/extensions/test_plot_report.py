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


_FULL_DISK = r'''
import resource, signal, sys
from minichain.training import extensions
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it: EFBIG
plot = extensions.PlotReport(['main/loss'], x_key='iteration')
plot._data['main/loss'] = [(i, 1.0 / (i + 1)) for i in range(50)]
resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
try:
    plot._plot(sys.argv[1])
except Exception as e:
    print(type(e).__name__, e.errno, e, e.__suppress_context__)
'''


def test_a_write_that_fails_is_one_oserror_naming_the_file(tmp_path):
    # A full disk came out of matplotlib's PNG writer as an AttributeError
    # of its cleanup chained to the OSError: 73 lines on rank 0. The file
    # size limit fails the same writes, without a full disk.
    import errno
    import subprocess
    path = tmp_path / 'loss.png'
    out = subprocess.run([sys.executable, '-c', _FULL_DISK, str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "OSError {} [Errno {}] PlotReport: cannot write the plot: File too "
        "large: '{}' True".format(errno.EFBIG, errno.EFBIG, path)], out
    assert list(tmp_path.iterdir()) == []  # no temporary file left
