"""Autodiff across processes (minichain/dist/functions/) under real
``mpiexec``: a network cut over 2 and 3 ranks with send and recv has the
gradients of the whole network on one process (float64, to 1e-10), each
collective's backward is the opposite collective (closed forms), and a
deadlock-prone order of messages ends with the watchdog's report instead of
hanging (workers/model_parallel_hang.py).
"""
import numpy
import pytest

import minichain
from minichain import functions as F
from minichain import links as L
from tests.dist._launch import require_mpi, run_mpi

TOL = dict(rtol=1e-10, atol=1e-10)


def linear(rng, n_in, n_out):
    """An L.Linear with float64 parameters drawn from ``rng``."""
    link = L.Linear(n_in, n_out)
    link.W.array = rng.standard_normal((n_out, n_in))
    link.b.array = rng.standard_normal(n_out)
    return link


def branched_links(size):
    """The links of the network of :func:`whole`: the same on every rank."""
    rng = numpy.random.default_rng(42)
    return {'first': linear(rng, 3, 6), 'head': linear(rng, 5, 2),
            'branches': [linear(rng, 6, 5) for _ in range(1, size)]}


def whole(links, x):
    """The network on one process: rank 0's first layer feeds one branch
    per other rank; the branches' sum goes through rank 0's head."""
    h = F.tanh(links['first'](x))
    hs = [F.tanh(b(h)) for b in links['branches']]
    return F.sum(links['head'](sum(hs[1:], hs[0])) ** 2)


def _comm():
    pytest.importorskip('mpi4py', reason='mpi4py is not installed '
                        '(pip install mpi4py mpich)')
    from minichain import dist
    return dist.create_communicator('naive')


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_send_recv_gradients_equal_one_process(mpi_ranks):
    from minichain.dist import functions as DF
    comm = _comm()
    x = numpy.random.default_rng(0).standard_normal((4, 3))
    ref = branched_links(comm.size)
    whole(ref, x).backward()
    mine = branched_links(comm.size)
    if comm.rank == 0:
        # rank 0 sends h to every other rank (one rank sending to two at
        # 3 ranks), then receives each branch: each send and receive hangs
        # behind the previous one, so backward meets them in reverse
        h = F.tanh(mine['first'](x))
        last = None
        for r in range(1, comm.size):
            if last is not None:
                h, = DF.pseudo_connect(last, h)
            last = DF.send(h, comm, r)
        hs = []
        for r in range(1, comm.size):
            hs.append(DF.recv(comm, r, delegate_variable=last))
            last = hs[-1]
        loss = F.sum(mine['head'](sum(hs[1:], hs[0])) ** 2)
        loss.backward()
        owned = ['first', 'head']
        numpy.testing.assert_allclose(loss.array, whole(ref, x).array, **TOL)
    else:
        h = DF.recv(comm, 0)
        DF.send(F.tanh(mine['branches'][comm.rank - 1](h)), comm,
                0).backward()
        owned = []
    pairs = [(mine[k], ref[k]) for k in owned]
    if comm.rank:
        pairs = [(mine['branches'][comm.rank - 1],
                  ref['branches'][comm.rank - 1])]
    for got, want in pairs:
        for p, q in zip(got.params(), want.params()):
            numpy.testing.assert_allclose(p.grad, q.grad, **TOL)


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_collectives_backward_is_the_opposite_collective(mpi_ranks):
    from minichain.dist import functions as DF
    comm = _comm()
    r, n = comm.rank, comm.size
    root = n - 1

    def var(a):
        return minichain.Variable(numpy.asarray(a, numpy.float64))

    # bcast: every rank's loss sum((r + 1) * y): root's x gets sum(r + 1)
    x = var(numpy.arange(3.0))
    y = DF.bcast(comm, x if r == root else None, root)
    numpy.testing.assert_array_equal(y.array, numpy.arange(3.0))
    F.sum((r + 1) * y).backward()
    if r == root:
        numpy.testing.assert_allclose(x.grad, [n * (n + 1) / 2] * 3)

    # gather: the root's loss sum_k (k + 1) * ys[k]: rank k's x gets k + 1
    x = var(numpy.full((2, 2), r))
    ys = DF.gather(comm, x, root)
    if r == root:
        assert len(ys) == n
        for k, yk in enumerate(ys):
            numpy.testing.assert_array_equal(yk.array, numpy.full((2, 2), k))
        sum(F.sum((k + 1) * yk) for k, yk in enumerate(ys)).backward()
    else:
        assert ys.shape == (0,)  # the delegate variable
        ys.backward()
    numpy.testing.assert_allclose(x.grad, numpy.full((2, 2), r + 1))

    # scatter: rank k's loss sum((k + 1) * y ** 2): xs[k] gets
    # 2 (k + 1) xs[k]
    xs = [var(numpy.arange(4.0) + k) for k in range(n)]
    y = DF.scatter(comm, xs if r == root else None, root)
    numpy.testing.assert_array_equal(y.array, numpy.arange(4.0) + r)
    F.sum((r + 1) * y ** 2).backward()
    if r == root:
        for k, xk in enumerate(xs):
            numpy.testing.assert_allclose(xk.grad, 2 * (k + 1) * xk.array)

    # allgather: rank s's loss sum_k c(s, k) * ys[k], c = 1 + s + 10 k:
    # rank k's x gets sum_s c(s, k) (a reduce-scatter)
    x = var(numpy.full(3, float(r)))
    ys = DF.allgather(comm, x)
    for k, yk in enumerate(ys):
        numpy.testing.assert_array_equal(yk.array, numpy.full(3, float(k)))
    sum(F.sum((1 + r + 10 * k) * yk) for k, yk in enumerate(ys)).backward()
    numpy.testing.assert_allclose(
        x.grad, [sum(1 + s + 10 * r for s in range(n))] * 3)

    # alltoall, a different shape for each pair: rank s's loss
    # sum_k c(s, k) * ys[k] ** 2: xs[s] on rank k gets 2 c(s, k) xs[s]
    xs = [var(numpy.full((r + 1, s + 1), 10 * r + s)) for s in range(n)]
    ys = DF.alltoall(comm, xs)
    for k, yk in enumerate(ys):
        numpy.testing.assert_array_equal(yk.array,
                                         numpy.full((k + 1, r + 1), 10 * k + r))
    sum(F.sum((1 + r + 10 * k) * yk ** 2)
        for k, yk in enumerate(ys)).backward()
    for s, xs_s in enumerate(xs):
        numpy.testing.assert_allclose(xs_s.grad,
                                      2 * (1 + s + 10 * r) * xs_s.array)


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_gradients_of_unused_outputs_are_sent_as_zeros(mpi_ranks):
    # rank 1 uses one of the two arrays it receives: the other's gradient
    # still travels back (as zeros), else rank 0's backward would wait
    from minichain.dist import functions as DF
    comm = _comm()
    if comm.rank == 0:
        a = minichain.Variable(numpy.ones(2))
        b = minichain.Variable(numpy.ones(3))
        DF.send((a, 2 * b), comm, 1).backward()
        numpy.testing.assert_array_equal(a.grad, [3.0, 3.0])
        numpy.testing.assert_array_equal(b.grad, numpy.zeros(3))
    else:
        ga, gb = DF.recv(comm, 0)
        assert gb.shape == (3,)
        F.sum(3 * ga).backward()


@pytest.mark.mpi
@pytest.mark.parametrize('case', ['send-first', 'recv-first'])
def test_a_deadlock_ends_with_the_watchdog_naming_the_ranks(case):
    require_mpi()
    res = run_mpi(2, 'model_parallel_hang.py', case, timeout=240,
                  env={'MINICHAIN_STALL_TIMEOUT': '120'})
    assert not res.timed_out, res.output
    assert res.returncode == 70, res.output
    assert 'ranks 0 and 1 wait for each other' in res.output, res.output
    verb = 'send to' if case == 'send-first' else 'receive from'
    for rank, peer in ((0, 1), (1, 0)):
        assert 'rank {}: waiting for'.format(peer) in res.output, res.output
        assert 'to {} rank {}'.format(verb, peer) in res.output, res.output
    assert res.elapsed < 100, res.output  # a verdict, not the timeout
