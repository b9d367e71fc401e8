"""MultiNodeChainList: one model whose pieces run on different processes.

Each rank builds its own MultiNodeChainList out of the pieces (links) it
runs, and says for each where its inputs come from and where its outputs go:
the model's arguments and result (``None``), or other ranks. Calling it runs
the pieces in the order they were added, with :func:`~minichain.dist.
functions.recv` and :func:`~minichain.dist.functions.send` between them, and
joins them into one graph with delegate variables, so that one ``backward``
on each rank runs every piece's backward in reverse order and the gradients
travel back along the same edges (docs/model_parallel.md).
"""
import collections

from minichain.dist.functions import pseudo_connect, recv, send
from minichain.link import ChainList


class MultiNodeChainList(ChainList):
    """A model whose pieces run on several ranks (ChainerMN's
    ``chainermn.MultiNodeChainList``).

    A three-layer MLP over two ranks: rank 0 computes the first layer, rank 1
    the second, and rank 0 the third and the loss::

        class Rank0(dist.MultiNodeChainList):
            def __init__(self, comm):
                super().__init__(comm)
                self.add_link(L.Linear(784, 100), rank_in=None, rank_out=1)
                self.add_link(L.Linear(100, 10), rank_in=1, rank_out=None)

        class Rank1(dist.MultiNodeChainList):
            def __init__(self, comm):
                super().__init__(comm)
                self.add_link(L.Linear(100, 100), rank_in=0, rank_out=0)

    On rank 0, ``model = L.Classifier(Rank0(comm))`` trains as usual; on
    rank 1, ``Rank1(comm)()`` (no arguments) returns a delegate variable,
    and ``backward`` on it is that rank's part of the backward pass.

    Args:
        comm: a :mod:`minichain.dist` communicator.
    """

    def __init__(self, comm):
        super().__init__()
        self._comm = comm
        self._rank_inouts = []

    def add_link(self, link, rank_in=None, rank_out=None):
        """Add the next piece.

        Args:
            link: the piece (any Link); it is called with its inputs, in
                the order of ``rank_in``, and returns a Variable or a tuple.
            rank_in: where its inputs come from: None (the model's
                arguments), a rank or a list of ranks (one input from each;
                this rank itself: an output it sent itself earlier).
            rank_out: where its output goes: None (the model's result; one
                piece at most), a rank or a list of ranks.
        """
        if rank_out is None and any(out is None for _, out in
                                    self._rank_inouts):
            raise ValueError('{}.add_link: only one piece can give the '
                             "model's result (rank_out=None)".format(
                                 type(self).__name__))
        super().add_link(link)
        self._rank_inouts.append((_ranks(rank_in), _ranks(rank_out)))

    def forward(self, *inputs):
        comm = self._comm
        to_self = collections.deque()  # outputs this rank sent itself
        result = None
        # The last variable of the graph so far that what comes next does
        # not depend on yet: the next piece is joined behind it.
        last = None
        for i, (link, (ranks_in, ranks_out)) in enumerate(
                zip(self, self._rank_inouts)):
            if ranks_in is None:
                xs = _behind(last, tuple(inputs))
            else:
                xs = []
                for r in ranks_in:
                    if r == comm.rank and not to_self:
                        raise ValueError(
                            '{}: piece {} takes an input from rank {} (this '
                            'rank), which no earlier piece sent itself: check '
                            'that rank_in and rank_out match'.format(
                                type(self).__name__, i, r))
                    if r == comm.rank:
                        x = _behind(last, to_self.popleft())
                    else:
                        x = recv(comm, r, delegate_variable=last)
                    xs.append(x)
                    last = _tail(x)  # the next receive comes after this
            h = link(*xs)  # h depends on everything before: nothing left
            if ranks_out is None:
                result, last = h, _tail(h)
                continue
            last = None
            for r in ranks_out:
                # Each send behind the previous one: backward receives
                # their gradients in the reverse order.
                h = _behind(last, h)
                if r == comm.rank:
                    to_self.append(h)
                    last = _tail(h)
                else:
                    last = send(h, comm, r)
        if to_self:
            raise ValueError(
                '{}: rank {} sent itself {} output(s) that no piece took as '
                'input: check that rank_in and rank_out match'.format(
                    type(self).__name__, comm.rank, len(to_self)))
        if result is None:
            return last  # nothing to return: backward starts here
        return _behind(None if _tail(result) is last else last, result)


def _ranks(ranks):
    if ranks is None:
        return None
    return [ranks] if isinstance(ranks, int) else list(ranks)


def _tail(x):
    return x[-1] if isinstance(x, tuple) else x


def _behind(delegate, x):
    """``x`` (a Variable or a tuple) joined behind ``delegate``, if any."""
    if delegate is None:
        return x
    if isinstance(x, tuple):
        return pseudo_connect(delegate, *x)
    return pseudo_connect(delegate, x)[0]
