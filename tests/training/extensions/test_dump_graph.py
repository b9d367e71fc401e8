import os
import warnings

import numpy
import pytest

import minichain.graph
from minichain import reporter as reporter_module
from minichain import iterators, optimizers, training
from minichain.training import extensions
from tests.training._util import make_data, make_model, make_trainer


def _run(tmp_path, ext, stop=(3, 'iteration'), **kwargs):
    trainer = make_trainer(tmp_path, stop=stop, extensions=[ext], **kwargs)
    with warnings.catch_warnings():  # `dot` may be missing: DOT text only
        warnings.simplefilter('ignore', RuntimeWarning)
        trainer.run()
    return trainer


def _reference_dot(**styles):
    """The graph of one training forward pass (batch of 5), before backward."""
    model = make_model()
    data = make_data()
    x = numpy.stack([data[i][0] for i in range(5)])
    t = numpy.array([data[i][1] for i in range(5)])
    loss = model(x, t)
    return minichain.graph.build_computational_graph(loss, **styles).dump()


def test_writes_the_whole_graph_of_the_loss(tmp_path):
    trainer = _run(tmp_path, extensions.DumpGraph('main/loss'))
    text = (tmp_path / 'cg.dot').read_text()
    assert text == _reference_dot()
    # Captured before backward freed it: every function still has inputs
    # (a freed one would be drawn dashed) and the leaves are there.
    assert 'dashed' not in text
    for label in ('(5, 4), float32', '(6, 4), float32', '(5,), int32',
                  '(), float32'):
        assert label in text, label
    assert 'report' not in trainer.reporter.__dict__  # the hook is gone


def test_a_graph_taken_after_backward_differs(tmp_path):
    # The negative control: what a naive extension reading the loss after
    # the update would get.
    model = make_model()
    data = make_data()
    x = numpy.stack([data[i][0] for i in range(5)])
    t = numpy.array([data[i][1] for i in range(5)])
    loss = model(x, t)
    loss.backward()
    late = minichain.graph.build_computational_graph(loss).dump()
    assert late != _reference_dot() and 'dashed' in late


def test_written_once_into_out(tmp_path, monkeypatch):
    calls = []
    real = minichain.graph.render
    monkeypatch.setattr(minichain.graph, 'render',
                        lambda g, path: calls.append(path) or real(g, path))
    _run(tmp_path, extensions.DumpGraph('main/loss', filename='g.dot'),
         stop=(4, 'iteration'))
    assert calls == [os.path.join(str(tmp_path), 'g.dot')]
    assert sorted(p for p in os.listdir(str(tmp_path))
                  if not p.endswith('.png')) == ['g.dot']  # no temp file


def test_styles(tmp_path):
    ext = extensions.DumpGraph(variable_style={'color': 'red'},
                               function_style={'style': 'filled'})
    _run(tmp_path, ext)
    text = (tmp_path / 'cg.dot').read_text()
    assert text == _reference_dot(variable_style={'color': 'red'},
                                  function_style={'style': 'filled'})
    assert 'color="red"' in text and 'style="filled"' in text


def test_png_without_dot_warns(tmp_path, monkeypatch):
    monkeypatch.setattr(minichain.graph.shutil, 'which', lambda name: None)
    trainer = make_trainer(tmp_path, stop=(1, 'iteration'),
                           extensions=[extensions.DumpGraph()])
    with pytest.warns(RuntimeWarning, match='dot'):
        trainer.run()
    assert os.listdir(str(tmp_path)) == ['cg.dot']


@pytest.mark.skipif(minichain.graph.shutil.which('dot') is None,
                    reason='Graphviz dot is not installed')
def test_png_with_dot(tmp_path):
    _run(tmp_path, extensions.DumpGraph())
    assert (tmp_path / 'cg.png').read_bytes()[:4] == b'\x89PNG'


def test_never_reported(tmp_path):
    trainer = make_trainer(tmp_path, stop=(2, 'iteration'),
                           extensions=[extensions.DumpGraph('main/nothing')])
    with pytest.raises(KeyError, match="'main/nothing' was never reported"):
        trainer.run()
    assert 'report' not in trainer.reporter.__dict__  # finalize unhooked


def test_reported_as_a_plain_number(tmp_path):
    model = make_model()

    def loss_func(x, t):
        loss = model(x, t)
        reporter_module.report({'plain': 1.5})
        return loss
    opt = optimizers.SGD().setup(model)
    it = iterators.SerialIterator(make_data(), 5)
    updater = training.StandardUpdater(it, opt, loss_func=loss_func)
    trainer = training.Trainer(updater, (1, 'iteration'), out=str(tmp_path))
    trainer.extend(extensions.DumpGraph('plain'))
    with pytest.raises(TypeError, match="'plain' was reported as a float"):
        trainer.run()


def test_training_is_unchanged(tmp_path):
    plain = make_trainer(tmp_path / 'a', stop=(4, 'iteration'))
    plain.run()
    dumped = _run(tmp_path / 'b', extensions.DumpGraph(), stop=(4, 'iteration'))
    params = [t.updater.get_optimizer().target.namedparams()
              for t in (plain, dumped)]
    for (_, p), (_, q) in zip(*params):
        numpy.testing.assert_array_equal(p.array, q.array)


def test_chainers_older_name_dump_graph(tmp_path):
    """Chainer's examples write trainer.extend(extensions.dump_graph(...))."""
    assert extensions.dump_graph is extensions.DumpGraph
    _run(tmp_path, extensions.dump_graph('main/loss', filename='g.dot'))
    assert (tmp_path / 'g.dot').read_text() == _reference_dot()
