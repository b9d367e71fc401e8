"""The communicator methods that ChainerMN's model-parallel code calls
(minichain/dist/transports/collectives.py), as ChainerMN 7.8.1 documents
them, under real ``mpiexec``, with the guards and bare (``layers=()``):
send and recv of arrays and tuples, recv_obj with ``status`` and any tag or
source, alltoall, scatter of a list, bcast_obj's ``max_buf_len``, and the
errors for a message to oneself or to no rank.
"""
import numpy
import pytest


def _comms():
    pytest.importorskip('mpi4py', reason='mpi4py is not installed '
                        '(pip install mpi4py mpich)')
    from minichain import dist
    return [dist.create_communicator('naive'),
            dist.create_communicator('naive', layers=())]


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_send_and_recv_arrays_and_tuples(mpi_ranks):
    for comm in _comms():
        r, n = comm.rank, comm.size
        nxt, prev = (r + 1) % n, (r - 1) % n
        one = numpy.full((2, 3), r, numpy.float16)
        pair = (numpy.arange(4.0) + r, numpy.full((1, 2), r, numpy.int32))
        # even ranks send first: no cycle of waits (odd n: rank n - 1 and
        # rank 0 are both even, but rank 0 sends before it receives)
        for data in (one, pair, list(pair)):
            if r % 2 == 0:
                comm.send(data, nxt, tag=5)
                got = comm.recv(prev, tag=5)
            else:
                got = comm.recv(prev, tag=5)
                comm.send(data, nxt, tag=5)
            if data is one:
                assert got.dtype == numpy.float16 and got.shape == (2, 3)
                assert (got == prev).all()
            else:
                assert isinstance(got, tuple) and len(got) == 2
                numpy.testing.assert_array_equal(got[0], numpy.arange(4.0)
                                                 + prev)
                assert got[1].dtype == numpy.int32 and (got[1] == prev).all()


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_recv_obj_any_tag_any_source_and_status(mpi_ranks):
    from mpi4py import MPI
    for comm in _comms():
        r, n = comm.rank, comm.size
        if r == 0:
            status = MPI.Status()
            got = sorted(comm.recv_obj(MPI.ANY_SOURCE, status=status)
                         for _ in range(n - 1))
            assert got == [('from', k) for k in range(1, n)]
            assert status.Get_tag() == 10 + status.Get_source()
        else:
            comm.send_obj(('from', r), 0, tag=10 + r)
        assert comm.bcast_obj('x' if r == 0 else None,
                              max_buf_len=1 << 20) == 'x'
        if r == 1:
            comm.send_obj('first', 0, tag=98)
            comm.send_obj('tagged', 0, tag=99)
        elif r == 0:  # a tag picks its message; then any tag
            status = MPI.Status()
            assert comm.recv_obj(1, status, tag=99) == 'tagged'
            assert (status.Get_source(), status.Get_tag()) == (1, 99)
            assert comm.recv_obj(1, status) == 'first'
            assert status.Get_tag() == 98


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_alltoall_and_scatter_of_a_list(mpi_ranks):
    for comm in _comms():
        r, n = comm.rank, comm.size
        xs = [numpy.full((r + 1, s + 1), 10 * r + s, numpy.float32)
              for s in range(n)]
        ys = comm.alltoall(xs)
        assert isinstance(ys, tuple) and len(ys) == n
        for s, y in enumerate(ys):
            assert y.shape == (s + 1, r + 1) and y.dtype == numpy.float32
            assert (y == 10 * s + r).all()
        rows = [numpy.arange(k + 1.0) for k in range(n)]  # lengths differ
        got = comm.scatter(rows if r == 0 else None, root=0)
        numpy.testing.assert_array_equal(got, numpy.arange(r + 1.0))
        stacked = numpy.arange(2.0 * n).reshape(n, 2)
        numpy.testing.assert_array_equal(
            comm.scatter(stacked if r == n - 1 else None, root=n - 1),
            stacked[r])


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_bad_peers_and_lengths_are_errors(mpi_ranks):
    for comm in _comms():
        r = comm.rank
        for call in (lambda: comm.send(numpy.ones(2), r),
                     lambda: comm.recv(r), lambda: comm.send_obj(1, 2),
                     lambda: comm.recv_obj(-5)):
            with pytest.raises(ValueError, match='rank {} cannot exchange '
                               'messages with rank'.format(r)):
                call()
        if comm.layers:  # the guards raise it on every rank
            with pytest.raises(ValueError, match='alltoall: rank 1 passed 1 '
                               'arrays for 2 ranks'):
                comm.alltoall([numpy.ones(1)] * (1 if r == 1 else 2))
            with pytest.raises(ValueError, match='scatter: root 0 passed 3 '
                               'rows for 2 ranks'):
                comm.scatter([numpy.ones(1)] * 3 if r == 0 else None)
