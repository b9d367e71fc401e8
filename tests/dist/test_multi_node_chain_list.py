"""MultiNodeChainList (minichain/dist/multi_node_chain_list.py) under real
``mpiexec``: a model split over 2 and 3 ranks, one rank sending to two,
trains with the gradients and parameters of the whole model on one process
(float64, to 1e-10); tuples, a rank sending to itself and a piece after the
model's result; the errors of add_link and of unmatched pieces.
"""
import numpy
import pytest

import minichain
from minichain import functions as F
from minichain import optimizers
from tests.dist.test_functions import TOL, _comm, branched_links, linear, \
    whole


class Piece(minichain.Chain):
    """A link around ``fn(link, *inputs)``."""

    def __init__(self, link, fn):
        super().__init__()
        with self.init_scope():
            self.link = link
        self.fn = fn

    def forward(self, *xs):
        return self.fn(self.link, *xs)


def split_model(comm, links):
    from minichain import dist
    model = dist.MultiNodeChainList(comm)
    others = list(range(1, comm.size))
    if comm.rank == 0:
        model.add_link(Piece(links['first'], lambda k, x: F.tanh(k(x))),
                       rank_in=None, rank_out=others)
        model.add_link(Piece(links['head'], lambda k, *hs: k(sum(
            hs[1:], hs[0]))), rank_in=others, rank_out=None)
    else:
        model.add_link(Piece(links['branches'][comm.rank - 1],
                             lambda k, h: F.tanh(k(h))), rank_in=0,
                       rank_out=0)
    return model


@pytest.mark.mpi(ranks=[2, 3], timeout=120)
def test_trains_as_the_whole_model_on_one_process(mpi_ranks):
    comm = _comm()
    x = numpy.random.default_rng(0).standard_normal((4, 3))
    ref, mine = branched_links(comm.size), branched_links(comm.size)
    ref_model = minichain.ChainList(ref['first'], ref['head'],
                                    *ref['branches'])
    ref_opt = optimizers.SGD(lr=0.05).setup(ref_model)
    model = split_model(comm, mine)
    opt = optimizers.SGD(lr=0.05).setup(model)
    for _ in range(3):
        ref_opt.update(lambda: whole(ref, x))
        if comm.rank == 0:
            opt.update(lambda: F.sum(model(x) ** 2))
            pairs = [(mine['first'], ref['first']),
                     (mine['head'], ref['head'])]
        else:
            opt.update(model)  # no inputs: returns a delegate variable
            pairs = [(mine['branches'][comm.rank - 1],
                      ref['branches'][comm.rank - 1])]
        for got, want in pairs:
            for p, q in zip(got.params(), want.params()):
                numpy.testing.assert_allclose(p.grad, q.grad, **TOL)
                numpy.testing.assert_allclose(p.array, q.array, **TOL)


def _tuples_links():
    rng = numpy.random.default_rng(7)
    return {k: linear(rng, *shape) for k, shape in (
        ('a', (3, 4)), ('b', (4, 2)), ('c', (3, 4)), ('d', (4, 4)),
        ('e', (4, 3)))}


def _pieces():
    return {
        'a': lambda k, x: (F.tanh(k(x)), 2 * k(x)),  # a tuple
        'd': lambda k, a: F.tanh(k(a[0] * a[1])),
        'b': lambda k, a, d: k(a[0] + d),
        'c': lambda k, x: F.tanh(k(x)),
        'e': lambda k, c: k(c)}


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_tuples_self_sends_and_a_piece_after_the_result(mpi_ranks):
    # rank 0: a(x) goes to rank 0 itself and to rank 1 (a tuple); b takes
    # both back and gives rank 0's result; c(x) comes after it, to rank 1.
    # rank 1: d(a) back to rank 0; e(c) gives rank 1's result.
    from minichain import dist
    comm = _comm()
    x = numpy.random.default_rng(1).standard_normal((5, 3))
    ref, mine, fn = _tuples_links(), _tuples_links(), _pieces()
    a = fn['a'](ref['a'], x)
    y0 = fn['b'](ref['b'], a, fn['d'](ref['d'], a))
    y1 = fn['e'](ref['e'], fn['c'](ref['c'], x))
    (F.sum(y0 ** 2) + F.sum(y1 ** 2)).backward()

    model = dist.MultiNodeChainList(comm)
    if comm.rank == 0:
        for name, rank_in, rank_out in (('a', None, [0, 1]), ('b', [0, 1],
                                        None), ('c', None, 1)):
            model.add_link(Piece(mine[name], fn[name]), rank_in, rank_out)
        y = model(x)
        numpy.testing.assert_allclose(y.array, y0.array, **TOL)
        owned = 'abc'
    else:
        model.add_link(Piece(mine['d'], fn['d']), rank_in=0, rank_out=0)
        model.add_link(Piece(mine['e'], fn['e']), rank_in=0, rank_out=None)
        y = model()
        numpy.testing.assert_allclose(y.array, y1.array, **TOL)
        owned = 'de'
    F.sum(y ** 2).backward()
    for name in owned:
        for p, q in zip(mine[name].params(), ref[name].params()):
            numpy.testing.assert_allclose(p.grad, q.grad, **TOL)


def test_add_link_refuses_a_second_result():
    from minichain import dist
    model = dist.MultiNodeChainList(comm=None)
    model.add_link(minichain.Chain(), rank_in=1, rank_out=None)
    with pytest.raises(ValueError, match='only one piece can give'):
        model.add_link(minichain.Chain(), rank_in=None, rank_out=None)
    assert len(model) == 1


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_an_output_sent_to_itself_and_never_taken_is_an_error(mpi_ranks):
    from minichain import dist
    comm = _comm()
    model = dist.MultiNodeChainList(comm)
    model.add_link(Piece(linear(numpy.random.default_rng(0), 2, 2),
                         lambda k, x: k(x)), rank_in=None,
                   rank_out=comm.rank)
    with pytest.raises(ValueError, match='sent itself 1 output'):
        model(numpy.ones((1, 2)))


@pytest.mark.mpi(ranks=[2], timeout=120)
def test_an_input_from_itself_that_was_never_sent_is_an_error(mpi_ranks):
    from minichain import dist
    comm = _comm()
    model = dist.MultiNodeChainList(comm)
    model.add_link(Piece(linear(numpy.random.default_rng(0), 2, 2),
                         lambda k, x: k(x)), rank_in=comm.rank,
                   rank_out=None)
    with pytest.raises(ValueError, match=r'MultiNodeChainList: piece 0 takes '
                       'an input from rank {} \\(this rank\\), which no '
                       'earlier piece sent itself'.format(comm.rank)):
        model(numpy.ones((1, 2)))
