"""The ring communicator (minichain/dist/ring.py) against MPI's Allreduce.

Its whole checks battery runs in test_battery.py (it is one of the
battery's communicators); here: the chunking, the rounding bound against
the flat communicator at 2-5 ranks and float64/32/16 over awkward buffer
lengths, the 2(N - 1) steps on the timeline, and the stall watchdog naming
a rank that leaves the ring (workers/ring_stall.py).
"""
import numpy
import pytest

from minichain.dist import ring
from tests.dist._launch import require_mpi, run_mpi
from tests.dist.workers._models import Flat


@pytest.mark.parametrize('n', [0, 1, 2, 3, 7, 10, 11, 1000])
@pytest.mark.parametrize('size', [1, 2, 3, 4, 5])
def test_chunks_cover_the_buffer_and_differ_by_at_most_one(n, size):
    bounds = ring.chunk_bounds(n, size)
    sizes = numpy.diff(bounds)
    assert len(sizes) == size and bounds[0] == 0 and bounds[-1] == n
    assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1


# the overlap checks of the battery (run there on flat) that hold for any
# communicator: each takes the communicator it averages with
OVERLAP_CHECKS = ('overlap_equivalence_mlp', 'overlap_equivalence_mnbn_unequal',
                  'overlap_shared_and_unused', 'overlap_equals_plain',
                  'overlap_launches_during_backward',
                  'accumulate_equals_large_batch', 'overlap_partial_gradients',
                  'overlap_join_uneven')


@pytest.mark.mpi(ranks=[1, 2, 3], timeout=240)
def test_overlapped_buckets_go_round_the_ring(mpi_ranks):
    pytest.importorskip('mpi4py', reason='mpi4py is not installed '
                        '(pip install mpi4py mpich)')
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'workers'))
    import checks_overlap
    from minichain import dist, optimizers
    comm = dist.create_communicator('ring')
    for name in OVERLAP_CHECKS:
        getattr(checks_overlap, name)(comm)
    # the buckets really are the ring's
    model = Flat([5, 7], numpy.float64)
    opt = dist.create_multi_node_optimizer(
        optimizers.SGD(lr=0.1), comm, overlap=True).setup(model)
    assert isinstance(opt.reducer.comm.bucket_transport(-1),
                      ring.RingBuckets)


def _bound(dtype, size, terms):
    """2 gamma_{N-1} sum|g_i|: how far two summation orders of N terms can
    be apart (each is within gamma_{N-1} sum|g_i| of the exact sum)."""
    u = numpy.finfo(dtype).eps / 2
    k = size - 1
    return 2 * k * u / (1 - k * u) * numpy.abs(terms).sum(axis=0)


def _average(comm, sizes, grads):
    """``multi_node_mean_grad`` of a model with parameters of ``sizes``
    whose gradients are ``grads`` (one flat array); the flat result."""
    model = Flat(sizes, grads.dtype)
    offsets = numpy.cumsum([0] + sizes)
    for (_, p), lo, hi in zip(model.namedparams(), offsets, offsets[1:]):
        p.grad = grads[lo:hi].copy()
    comm.multi_node_mean_grad(model)
    return numpy.concatenate([p.grad for _, p in model.namedparams()])


def _mpi_has(dtype):
    """Whether MPI can sum ``dtype`` (Open MPI has no float16 type: the
    flat communicator cannot average float16 there; the ring, which sends
    bytes and adds in NumPy, can)."""
    from mpi4py import MPI
    try:
        MPI.Datatype.fromcode(numpy.dtype(dtype).char)
    except (ValueError, KeyError):
        return False
    return True


def _check_against_flat(ring_comm, flat_comm, dtype, sizes):
    size, rank = ring_comm.size, ring_comm.rank
    n = sum(sizes)
    rng = numpy.random.default_rng([rank, n])
    grads = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)
             ).astype(dtype)
    got = _average(ring_comm, sizes, grads)
    every = numpy.array(ring_comm.mpi_comm.allgather(got))
    assert (every == got).all(), 'ranks differ: {} {}'.format(dtype, sizes)
    # the terms summed: each rank's gradient scaled by 1/N in the buffer
    terms = numpy.array(ring_comm.mpi_comm.allgather(
        (grads * dtype(1.0 / size)).astype(numpy.float64)))
    exact = terms.sum(axis=0)
    assert (numpy.abs(got - exact) <= _bound(dtype, size, terms) / 2).all()
    if _mpi_has(dtype):
        # float16: each of flat's and the ring's partial sums is rounded
        # to float16 as it goes, as in the bound, which holds as it is
        want = _average(flat_comm, sizes, grads)
        gap = numpy.abs(got.astype(numpy.float64) - want)
        bound = _bound(dtype, size, terms)
        assert (gap <= bound).all(), (dtype, sizes, gap.max(),
                                      (gap - bound).max())


@pytest.mark.mpi(ranks=[2, 3, 4, 5], timeout=240)
def test_ring_equals_flat_to_the_rounding_of_another_order(mpi_ranks,
                                                          monkeypatch):
    pytest.importorskip('mpi4py', reason='mpi4py is not installed '
                        '(pip install mpi4py mpich)')
    from minichain import dist
    from minichain.dist.transports import pipeline
    from minichain.dist import mpi as _mpi
    ring_comm = dist.create_communicator('ring')
    flat_comm = dist.create_communicator('flat')
    size = ring_comm.size
    # lengths: fewer elements than ranks, not a multiple of N, one, and
    # a parameter of zero elements among others
    layouts = [[1], [size - 1], [size + 1], [2 * size + 1], [3, 0, 4],
               [1000, 7], [12345]]
    for dtype in (numpy.float64, numpy.float32, numpy.float16):
        for sizes in layouts:
            _check_against_flat(ring_comm, flat_comm, dtype, sizes)
    # the pipeline chunks of flat (each summed around the ring) and the
    # pieces below CHUNK_BYTES that one ring step is sent in
    monkeypatch.setattr(pipeline, 'PIPELINE_BYTES', 8 * 100)
    monkeypatch.setattr(_mpi, 'CHUNK_BYTES', 24)
    for dtype in (numpy.float64, numpy.float32):
        _check_against_flat(ring_comm, flat_comm, dtype, [250, 3])
    # the closed form: integers are summed exactly in any order
    got = _average(ring_comm, [5, size + 2],
                   numpy.full(size + 7, ring_comm.rank, numpy.float64))
    assert (got == (size - 1) / 2).all(), got


@pytest.mark.mpi(ranks=[3], timeout=120)
def test_each_of_the_2_n_minus_1_steps_is_on_the_timeline(tmp_path):
    pytest.importorskip('mpi4py', reason='mpi4py is not installed '
                        '(pip install mpi4py mpich)')
    from minichain import dist
    from minichain.dist.trace import timeline
    comm = dist.create_communicator('ring')
    n = 3001  # chunks of 1000, 1000 and 1001 float64 elements
    with timeline.record(tmp_path / 'ring.json', comm, out=None) as rec:
        _average(comm, [n], numpy.ones(n))
    names = [e[0] for e in rec.events if e[0] in (
        'allreduce', 'reduce-scatter', 'allgather')]
    assert names == ['reduce-scatter'] * 2 + ['allgather'] * 2 + [
        'allreduce'], names  # a span is recorded when it ends
    outer = [e for e in rec.events if e[0] == 'allreduce'][0]
    for name, start, end, nbytes in rec.events:
        if name in ('reduce-scatter', 'allgather'):
            assert outer[1] <= start <= end <= outer[2]
            assert nbytes in (8000, 8008), (name, nbytes)
    bounds = ring.chunk_bounds(n, 3)
    sent = [e[3] for e in rec.events if e[0] == 'reduce-scatter']
    r = comm.rank
    assert sent == [8 * (bounds[(r - s) % 3 + 1] - bounds[(r - s) % 3])
                    for s in range(2)]


# case -> words the output must hold; rank 1 of 3 leaves the ring in the
# middle of the reduce-scatter (at its second step): rank 2, whose left
# neighbour it is, waits for a chunk that never comes
STALLS = {
    'sleep': ('rank 1: no word from it', 'in multi_node_mean_grad #2',
              'ring communicator over 3 ranks', 'the stall timeout'),
    'exit': ('rank 1: left (its program ended',
             'in multi_node_mean_grad #2', 'ring communicator over 3 ranks'),
}


@pytest.mark.mpi
@pytest.mark.parametrize('case', sorted(STALLS))
def test_the_watchdog_names_a_rank_that_leaves_the_ring(case):
    require_mpi()
    # the job ends about 5 s after the first averaging; the margin is for
    # a loaded machine (one run under Open MPI at load 11 passed 90 s)
    res = run_mpi(3, 'ring_stall.py', case, timeout=150,
                  env={'MINICHAIN_STALL_TIMEOUT': '4'})
    assert not res.timed_out, res.output
    assert res.returncode != 0, res.output
    assert 'watchdog' in res.output, res.output
    for words in STALLS[case]:
        assert words in res.output, (words, res.output)
    assert 'ring step 2 of rank 1' in res.output, res.output
    assert 'all done' not in res.output, res.output
