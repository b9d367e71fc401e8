import json

import numpy
import pytest

import minichain
from minichain import reporter as reporter_module
from minichain import links as L
from minichain.reporter import DictSummary, Reporter, Summary
from minichain.serializers import DictionarySerializer, NpzDeserializer


def test_report_with_observer_prefixes_the_name():
    r = Reporter()
    link = L.Linear(2, 2)
    r.add_observer('main', link)
    observation = {}
    with r.scope(observation):
        minichain.report({'loss': 1.5}, link)
        minichain.report({'free': 2})
    assert observation == {'main/loss': 1.5, 'free': 2}


def test_add_observers_uses_link_paths():
    model = minichain.Sequential(L.Linear(2, 2), L.Linear(2, 2))
    r = Reporter()
    r.add_observers('main', model.namedlinks(skipself=True))
    child = list(model.children())[1]
    obs = {}
    with r.scope(obs):
        minichain.report({'x': 1}, child)
    assert obs == {'main/1/x': 1}


def test_unregistered_observer_raises():
    with Reporter():
        with pytest.raises(KeyError, match='not registered'):
            minichain.report({'a': 1}, object())


def test_report_without_reporter_is_a_noop():
    minichain.report({'a': 1})  # nothing active: nothing happens


def test_variables_are_stored_without_graph():
    x = minichain.Variable(numpy.array(2.0, numpy.float32))
    y = x * x
    obs = {}
    with Reporter().scope(obs):
        minichain.report({'y': y})
    assert isinstance(obs['y'], numpy.ndarray) and obs['y'] == 4.0


def test_nested_scopes_and_report_scope():
    r = Reporter()
    outer, inner = {}, {}
    with r.scope(outer):
        with minichain.report_scope(inner):
            minichain.report({'a': 1})
        minichain.report({'b': 2})
    assert inner == {'a': 1} and outer == {'b': 2}
    assert r.observation == {}


def test_report_scope_without_reporter_raises():
    with pytest.raises(RuntimeError, match='no reporter'):
        with minichain.report_scope({}):
            pass


def test_summary_weighted_mean_and_std():
    s = Summary()
    s.add(1.0, weight=1)
    s.add(numpy.float32(4.0), weight=3)
    s.add(minichain.Variable(numpy.array(2.0)), weight=2)
    values = numpy.array([1, 4, 4, 4, 2, 2], dtype=numpy.float64)
    mean, std = s.make_statistics()
    assert float(s.compute_mean()) == pytest.approx(values.mean())
    assert float(std) == pytest.approx(values.std())


def test_summary_rejects_arrays_and_empty_mean():
    with pytest.raises(ValueError, match='scalar'):
        Summary().add(numpy.zeros(3))
    with pytest.raises(ValueError, match='nothing was added'):
        Summary().compute_mean()


def test_dict_summary_skips_non_scalars():
    d = DictSummary()
    d.add({'a': 1.0, 'b': numpy.zeros(2), 'c': 'text'})
    d.add({'a': 3.0})
    assert d.compute_mean() == {'a': 2.0}
    stats = d.make_statistics()
    assert stats['a'] == 2.0 and float(stats['a.std']) == 1.0


def test_dict_summary_serialization_round_trip():
    d = DictSummary()
    d.add({'a': 1.0, 'b/c': 5.0}, weight=2)
    d.add({'a': 4.0})
    saver = DictionarySerializer()
    saver.save(d)
    assert json.loads(str(saver.target['_names'])) == ['a', 'b/c']
    e = DictSummary()
    e.add({'stale': 1.0})
    NpzDeserializer(saver.target).load(e)
    assert e.compute_mean() == pytest.approx({'a': 2.0, 'b/c': 5.0})


def test_reporter_stack_is_restored_after_error():
    r = Reporter()
    with pytest.raises(ZeroDivisionError):
        with r.scope({}):
            1 / 0
    with pytest.raises(RuntimeError):
        reporter_module.get_current_reporter()
