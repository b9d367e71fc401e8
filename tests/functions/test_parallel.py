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


# -- matmul ----------------------------------------------------------------
@pytest.fixture
def split_products(monkeypatch):
    monkeypatch.setattr(backend, '_host_threads', 2)
    monkeypatch.setattr(_parallel, '_MIN_MACS', 1)
    monkeypatch.setattr(_parallel, '_ALIGN', 1)


@pytest.mark.parametrize('m,k,n', [(3, 5, 40), (40, 5, 3), (17, 9, 17)])
@pytest.mark.parametrize('batched', [False, True])
@pytest.mark.parametrize('given_out', [False, True])
def test_matmul_split_equals_one_product(split_products, m, k, n, batched,
                                         given_out):
    rng = numpy.random.default_rng(0)
    lead = (1,) if batched else ()
    a = rng.standard_normal(lead + (m, k))
    b = rng.standard_normal(lead + (k, n))
    out = numpy.full(lead + (m, n), numpy.nan) if given_out else None
    y = _parallel.matmul(a, b, out=out)
    assert y.shape == lead + (m, n)
    if given_out:
        assert y is out
    numpy.testing.assert_allclose(y, a @ b, rtol=1e-12, atol=1e-12)


def test_matmul_split_uses_both_threads_and_strided_operands(
        split_products, monkeypatch):
    # Operands as the convolutions pass them: a transposed view, and an
    # output that is a column slice of a larger row-major array.
    rng = numpy.random.default_rng(1)
    a = rng.standard_normal((6, 4)).astype(numpy.float32)
    bt = rng.standard_normal((50, 4)).astype(numpy.float32)
    big = numpy.zeros((6, 70), numpy.float32)
    names = set()
    real = numpy.matmul

    def spy(x, y, out=None):
        names.add(threading.current_thread().name)
        return real(x, y, out=out)
    monkeypatch.setattr(_parallel.numpy, 'matmul', spy)
    try:
        _parallel.matmul(a, bt.T, out=big[:, 10:60])
    finally:
        monkeypatch.setattr(_parallel.numpy, 'matmul', real)
    assert len(names) == 2
    numpy.testing.assert_allclose(big[:, 10:60], a @ bt.T, rtol=1e-5)
    assert not big[:, :10].any() and not big[:, 60:].any()


def test_matmul_one_thread_or_small_is_one_call(monkeypatch):
    calls = []
    real = numpy.matmul
    monkeypatch.setattr(_parallel.numpy, 'matmul',
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    a, b = numpy.ones((64, 64)), numpy.ones((64, 64))
    monkeypatch.setattr(backend, '_host_threads', 1)
    _parallel.matmul(a, b)
    monkeypatch.setattr(backend, '_host_threads', 2)
    _parallel.matmul(a, b)  # 262,144 multiply-adds: below _MIN_MACS
    assert calls == [1, 1]
