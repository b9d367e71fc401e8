import numpy
import pytest

import minichain
from minichain import iterators
from minichain.dataset import concat_examples
from minichain.training import extensions
from tests.training._util import make_data, make_model, make_trainer


def _full_set_metrics(model, data):
    x, t = concat_examples(data[:])
    with minichain.no_backprop_mode():
        loss = model(x, t)
    return float(loss.array), float(model.accuracy.array)


def test_per_example_mean_over_unequal_batches():
    data, model = make_data(), make_model()
    it = iterators.SerialIterator(data, 5, repeat=False, shuffle=False)
    result = extensions.Evaluator(it, model)()
    loss, acc = _full_set_metrics(model, data)
    assert set(result) == {'validation/main/loss', 'validation/main/accuracy'}
    assert float(result['validation/main/loss']) == pytest.approx(loss,
                                                                  rel=1e-5)
    assert float(result['validation/main/accuracy']) == pytest.approx(acc)
    again = extensions.Evaluator(it, model)()  # the iterator is reset
    assert again == result


def test_runs_in_test_mode_without_graph():
    seen = []
    model = make_model()
    inner = model.predictor.forward

    def spy(x):
        seen.append((minichain.config.train,
                     minichain.config.enable_backprop))
        return inner(x)

    model.predictor.forward = spy
    hooked = []
    it = iterators.SerialIterator(make_data(), 10, repeat=False)
    extensions.Evaluator(it, model, eval_hook=hooked.append)()
    assert seen == [(False, False)] * 3
    assert len(hooked) == 1
    assert minichain.config.train and minichain.config.enable_backprop


def test_reports_into_the_trainer_under_its_name(tmp_path):
    seen = []
    model_data = make_data()
    trainer = make_trainer(tmp_path, stop=(1, 'epoch'))
    model = trainer.updater.get_optimizer().target
    it = iterators.SerialIterator(model_data, 8, repeat=False)
    trainer.extend(extensions.Evaluator(it, model))
    trainer.extend(extensions.Evaluator(it, model), name='val')
    trainer.extend(lambda t: seen.append(dict(t.observation)),
                   trigger=(1, 'epoch'), name='spy')
    trainer.run()
    assert {'validation/main/loss', 'val/main/accuracy',
            'main/loss'} <= set(seen[-1])
    assert seen[-1]['validation/main/loss'] == seen[-1]['val/main/loss']


def test_eval_func_and_dict_targets():
    data = make_data()
    model = make_model()
    calls = []

    def eval_func(x, t):
        calls.append(len(x))
        minichain.report({'n': len(x)}, model)

    it = iterators.SerialIterator(data, 10, repeat=False, shuffle=False)
    result = extensions.Evaluator({'main': it}, {'main': model},
                                  eval_func=eval_func)()
    assert calls == [10, 10, 4]
    # each batch weighted by its size: (10*10 + 10*10 + 4*4) / 24
    assert float(result['validation/main/n']) == pytest.approx(216 / 24)


def test_repeating_iterator_is_refused():
    it = iterators.SerialIterator(make_data(), 5)
    with pytest.raises(ValueError, match='repeat=False'):
        extensions.Evaluator(it, make_model())


def test_device_spec_is_resolved():
    it = iterators.SerialIterator(make_data(), 5, repeat=False)
    evaluator = extensions.Evaluator(it, make_model(), device=-1)
    assert evaluator.device == minichain.get_device('@numpy')
    assert numpy.isfinite(float(evaluator()['validation/main/loss']))


def test_progress_bar_shows_the_batches(capsys, monkeypatch):
    from minichain.training.extensions import progress_bar
    data, model = make_data(), make_model()  # 24 examples: 5 batches
    it = iterators.SerialIterator(data, 5, repeat=False, shuffle=False)
    result = extensions.Evaluator(it, model)()
    assert capsys.readouterr().out == ''  # off by default
    monkeypatch.setattr(progress_bar, '_load_tqdm', lambda: None)
    shown = extensions.Evaluator(it, model, progress_bar=True)()
    assert shown == result
    assert capsys.readouterr().out.splitlines() == [
        'validation {}/5 batches'.format(i) for i in range(1, 6)]
    monkeypatch.undo()
    pytest.importorskip('tqdm')
    extensions.Evaluator(it, model, progress_bar=True)()
    text = capsys.readouterr().out
    assert 'validation:' in text and '0/5' in text
