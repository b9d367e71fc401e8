"""minichain.kernels.numpy._parallel: row-block splitting of elementwise
work."""
import threading

import numpy
import pytest

from minichain import Variable, host
from minichain import functions as F
from minichain.kernels.numpy import _parallel


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setattr(host, '_host_threads', 2)
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
    monkeypatch.setattr(host, '_host_threads', 2)
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
    monkeypatch.setattr(host, '_host_threads', 1)
    ref = run()
    monkeypatch.setattr(host, '_host_threads', 2)
    monkeypatch.setattr(_parallel, '_MIN_BYTES', 1)
    for r, s in zip(ref, run()):
        numpy.testing.assert_array_equal(r, s)


# -- products on minichain's own threads ----------------------------------------
@pytest.fixture
def op_threads(monkeypatch):
    """Pretend to be inside an op that may use three threads."""
    monkeypatch.setattr(host, 'cpu_kernel_threads', lambda: 3)
    monkeypatch.setattr(_parallel, '_MIN_PRODUCT', 1)


def test_over_chunks_deals_contiguous_runs_in_order(op_threads):
    names = {}

    def fn(run):
        names[tuple(run)] = threading.current_thread().name
        assert _parallel.product_threads() == 1  # no nested splitting
        return sum(run)
    out = _parallel.over_chunks(fn, list(range(7)))
    assert out == [0 + 1, 2 + 3, 4 + 5 + 6]
    assert sorted(names) == [(0, 1), (2, 3), (4, 5, 6)]
    me = threading.current_thread().name
    assert names[(0, 1)] == me
    assert names[(2, 3)] != me and names[(4, 5, 6)] != me
    assert _parallel.product_threads() == 3  # the caller is free again


def test_no_nested_splits_inside_a_share(op_threads, two_threads):
    """A share of a split runs its elementwise passes and products whole."""
    inner = []

    def fn(run):
        _parallel.split_rows(lambda s: inner.append(s), 8, 1 << 30)
        return _parallel.product_threads()
    assert _parallel.over_chunks(fn, [0, 1]) == [1, 1]
    assert inner == [slice(0, 8), slice(0, 8)]


def test_over_chunks_one_chunk_or_one_thread_stays_on_the_caller(
        op_threads, monkeypatch):
    assert _parallel.over_chunks(lambda run: run, ['a']) == [['a']]
    monkeypatch.setattr(host, 'cpu_kernel_threads', lambda: 1)
    assert _parallel.over_chunks(lambda run: run, [1, 2]) == [[1, 2]]


def test_over_chunks_waits_for_every_run_before_raising(op_threads):
    done = []

    def fn(run):
        if run[0] == 0:
            raise KeyError('boom')
        threading.Event().wait(0.05)
        done.append(run)
    with pytest.raises(KeyError):
        _parallel.over_chunks(fn, [0, 1, 2])
    assert sorted(done) == [[1], [2]]


@pytest.mark.parametrize('shapes', [((7, 5), (5, 4)), ((2, 7, 5), (2, 5, 3)),
                                    ((2, 5), (5, 3)), ((5,), (5, 3)),
                                    ((3, 2, 5), (5, 4))])
def test_matmul_by_row_blocks_matches_numpy(op_threads, shapes):
    rng = numpy.random.default_rng(0)
    a, b = (rng.standard_normal(s) for s in shapes)
    numpy.testing.assert_allclose(_parallel.matmul(a, b), a @ b, rtol=1e-13)
    out = numpy.empty((a @ b).shape)
    assert _parallel.matmul(a, b, out=out) is out
    numpy.testing.assert_allclose(out, a @ b, rtol=1e-13)
    # transposed views, as the convolutions pass them
    if a.ndim == b.ndim:
        bt, at = numpy.swapaxes(b, -1, -2), numpy.swapaxes(a, -1, -2)
        numpy.testing.assert_allclose(_parallel.matmul(bt, at), bt @ at,
                                      rtol=1e-13)


def _split_in_child(queue):
    host.cpu_kernel_threads = lambda: 2  # the child's own module state
    _parallel._MIN_PRODUCT = 1
    a = numpy.arange(12.0).reshape(4, 3)
    queue.put(_parallel.over_chunks(lambda run: sum(run), [1, 2, 3, 4]) +
              [float(_parallel.matmul(a, a.T).sum())])


@pytest.mark.skipif(not hasattr(__import__('os'), 'fork'),
                    reason='needs fork')
def test_a_forked_child_runs_splits_on_threads_of_its_own(op_threads):
    """The parent's pool threads do not exist in a forked child; work the
    child hands out must still run (it hung before pools were dropped at
    fork)."""
    import multiprocessing
    assert _parallel.over_chunks(lambda run: sum(run), [1, 2]) == [1, 2]
    ctx = multiprocessing.get_context('fork')
    queue = ctx.Queue()
    child = ctx.Process(target=_split_in_child, args=(queue,))
    child.start()
    child.join(30)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive, 'the forked child hung on its inherited pool'
    a = numpy.arange(12.0).reshape(4, 3)
    assert queue.get(timeout=5) == [3, 7, float((a @ a.T).sum())]


def test_add_into_adds_in_place_on_two_threads(two_threads):
    rng = numpy.random.default_rng(3)
    a, b = rng.standard_normal((2, 9, 5))
    want = a + b
    out = a.copy()
    assert _parallel.add_into(out, b) is out
    numpy.testing.assert_array_equal(out, want)
    view = a.copy().transpose(1, 0)  # any strides
    _parallel.add_into(view, b.T)
    numpy.testing.assert_array_equal(view, want.T)
