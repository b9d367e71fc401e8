"""minichain.functions._parallel: row-block splitting of elementwise work."""
import threading

import numpy
import pytest

from minichain import Variable, backend
from minichain import functions as F
from minichain.functions import _parallel


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setattr(backend, '_host_threads', 2)
    monkeypatch.setattr(_parallel, '_MIN_BYTES', 1)


def test_split_rows_covers_each_row_once_on_two_threads(two_threads):
    seen, names = [], set()

    def fn(s):
        seen.extend(range(s.start, s.stop))
        names.add(threading.current_thread().name)
    _parallel.split_rows(fn, 7, 1 << 30)
    assert sorted(seen) == list(range(7))
    assert len(names) == 2


def test_split_rows_small_work_stays_on_the_caller(monkeypatch):
    monkeypatch.setattr(backend, '_host_threads', 2)
    names = []
    _parallel.split_rows(
        lambda s: names.append((s, threading.current_thread().name)), 8, 10)
    assert names == [(slice(0, 8), threading.current_thread().name)]


def test_split_rows_reraises_worker_errors(two_threads):
    def fn(s):
        if s.start > 0:
            raise KeyError('boom')
    with pytest.raises(KeyError):
        _parallel.split_rows(fn, 4, 1 << 30)


def test_elementwise_mismatched_shapes_run_whole():
    out = numpy.empty((3, 4))
    _parallel.elementwise(lambda o, a: numpy.add(a, 1, out=o), out,
                          numpy.zeros((1, 4)))
    numpy.testing.assert_array_equal(out, numpy.ones((3, 4)))


@pytest.mark.parametrize('shape', [(5, 3, 4), (2, 6), (1,), ()])
def test_split_ops_match_plain_numpy(two_threads, shape):
    rng = numpy.random.default_rng(0)
    a = rng.standard_normal(shape).astype(numpy.float32)
    b = rng.standard_normal(shape).astype(numpy.float32)
    v = Variable(a)
    y = F.relu(v)
    numpy.testing.assert_array_equal(y.array, numpy.maximum(a, 0))
    numpy.testing.assert_array_equal((y + b).array, numpy.maximum(a, 0) + b)
    y.grad = b
    y.backward()
    numpy.testing.assert_array_equal(v.grad, b * (a > 0))


def test_split_batch_normalization_matches_serial(monkeypatch):
    rng = numpy.random.default_rng(1)
    x = rng.standard_normal((4, 3, 5, 5)).astype(numpy.float32)
    gamma = rng.standard_normal(3).astype(numpy.float32)
    beta = rng.standard_normal(3).astype(numpy.float32)
    gy = rng.standard_normal(x.shape).astype(numpy.float32)

    def run():
        v = Variable(x.copy())
        y = F.batch_normalization(v, gamma, beta)
        y.grad = gy
        y.backward()
        return y.array, v.grad
    monkeypatch.setattr(backend, '_host_threads', 1)
    ref = run()
    monkeypatch.setattr(backend, '_host_threads', 2)
    monkeypatch.setattr(_parallel, '_MIN_BYTES', 1)
    for r, s in zip(ref, run()):
        numpy.testing.assert_array_equal(r, s)
