import numpy
import pytest

import minichain
from minichain import functions as F
from minichain import links as L


def _data():
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((6, 4)).astype(numpy.float32)
    t = numpy.array([0, 1, 2, 0, 1, 2], dtype=numpy.int32)
    return x, t


def test_loss_accuracy_and_reports():
    x, t = _data()
    model = L.Classifier(L.Linear(4, 3))
    reporter = minichain.Reporter()
    reporter.add_observer('main', model)
    obs = {}
    with reporter.scope(obs):
        loss = model(x, t)
    y = model.predictor(x)
    numpy.testing.assert_allclose(
        loss.array, F.softmax_cross_entropy(y, t).array, rtol=1e-6)
    numpy.testing.assert_allclose(model.accuracy.array,
                                  F.accuracy(y, t).array)
    assert set(obs) == {'main/loss', 'main/accuracy'}
    assert obs['main/loss'] == loss.array
    loss.backward()
    assert model.predictor.W.grad.shape == (3, 4)


def test_runs_without_a_reporter_and_without_accuracy():
    x, t = _data()
    model = L.Classifier(L.Linear(4, 3))
    model.compute_accuracy = False
    model(x, t)
    assert model.accuracy is None and model.y.shape == (6, 3)


def test_label_keys_and_custom_functions():
    x, t = _data()

    def predictor(a, b):
        return a - b

    model = L.Classifier(predictor, label_key=0,
                         lossfun=lambda y, t: F.sum(y) * 0 + 1.0 * len(t),
                         accfun=lambda y, t: F.sum(y))
    loss = model(t, x, x)
    assert float(loss.array) == 6.0 and float(model.accuracy.array) == 0.0
    model = L.Classifier(lambda x: x[:, :3], label_key='label')
    loss = model(x, label=t)
    assert loss.shape == ()


def test_bad_label_keys():
    x, t = _data()
    with pytest.raises(TypeError, match='label_key'):
        L.Classifier(L.Linear(4, 3), label_key=1.5)
    with pytest.raises(ValueError, match='out of range'):
        L.Classifier(L.Linear(4, 3), label_key=2)(x, t)
    with pytest.raises(ValueError, match="'label'.*missing"):
        L.Classifier(L.Linear(4, 3), label_key='label')(x, t)


def test_predictor_is_a_registered_child():
    model = L.Classifier(L.Linear(4, 3))
    assert [p for p, _ in model.namedparams()] == ['/predictor/W',
                                                   '/predictor/b']
