"""Collective communication as functions: each one's backward is the
opposite collective, run on the gradients.

=============  ===========================  ==============================
function       forward                      backward (on the gradients)
=============  ===========================  ==============================
``bcast``      root's x to every rank       gather to the root, summed
``gather``     every rank's x to the root   scatter from the root
``scatter``    root's xs[r] to rank r       gather to the root
``allgather``  every rank's x to every one  alltoall, summed: a
                                            reduce-scatter
``alltoall``   xs[s] to rank s              alltoall back
=============  ===========================  ==============================

Every rank must call the same collectives in the same order, in forward and
so in backward: a rank's backward must reach each of them (a rank that only
sends, as a non-root ``gather`` does, gets a delegate variable to call
``backward`` on, as :func:`~minichain.dist.functions.send` returns). Each
backward is written with these functions themselves, so that the gradient
is a graph as well (double backprop, when every rank asks for it).
"""
from minichain import backend
from minichain.dist.functions.point_to_point import (
    delegate_array, zeros_for_none)
from minichain.function_node import FunctionNode
from minichain.variable import Variable


def _sum(variables):
    return sum(variables[1:], variables[0])


class Collective(FunctionNode):
    """A collective over ``comm`` with ``root`` (None: rootless)."""

    def __init__(self, comm, root=None):
        self.comm, self.root = comm, root

    @property
    def label(self):
        root = '' if self.root is None else ' (root {})'.format(self.root)
        return type(self).__name__ + root

    @property
    def is_root(self):
        return self.comm.rank == self.root


class Bcast(Collective):
    """The root's input on every rank (elsewhere the input is a dummy)."""

    def forward(self, inputs):
        return self.comm.bcast(inputs[0] if self.is_root else None,
                               self.root),

    def backward(self, indexes, grad_outputs):
        gys = gather(self.comm, grad_outputs[0], self.root)
        return (_sum(gys) if self.is_root else None),


class Gather(Collective):
    """Every rank's input, as one output per rank, on the root; elsewhere
    a delegate variable."""

    def forward(self, inputs):
        x, = inputs
        ys = self.comm.gather(x, self.root)
        if not self.is_root:
            return delegate_array(backend.get_array_module(x)),
        return tuple(ys)

    def backward(self, indexes, grad_outputs):
        if not self.is_root:
            return scatter(self.comm, None, self.root),
        x = self.inputs[0]
        gys = zeros_for_none(grad_outputs, [(x.shape, x.dtype)] *
                             self.comm.size, x.xp)
        return scatter(self.comm, gys, self.root),


class Scatter(Collective):
    """Input ``r`` of the root to rank ``r`` (elsewhere the input is a
    dummy)."""

    def forward(self, inputs):
        return self.comm.scatter(inputs if self.is_root else None,
                                 self.root),

    def backward(self, indexes, grad_outputs):
        gxs = gather(self.comm, grad_outputs[0], self.root)
        return gxs if self.is_root else (None,)


class AllGather(Collective):
    """Every rank's input, as one output per rank, on every rank."""

    def forward(self, inputs):
        return tuple(self.comm.allgather(inputs[0]))

    def backward(self, indexes, grad_outputs):
        x = self.inputs[0]
        gys = zeros_for_none(grad_outputs, [(x.shape, x.dtype)] *
                             self.comm.size, x.xp)
        # Rank s holds the gradient of this rank's x in its gys[rank]:
        # alltoall brings each home, and the sum is a reduce-scatter.
        return _sum(alltoall(self.comm, gys)),


class AllToAll(Collective):
    """Input ``s`` to rank ``s``; output ``s`` from rank ``s``."""

    def forward(self, inputs):
        ys = self.comm.alltoall(inputs)
        self.metas = [(y.shape, y.dtype) for y in ys]
        return ys

    def backward(self, indexes, grad_outputs):
        xp = self.inputs[0].xp
        return alltoall(self.comm, zeros_for_none(grad_outputs, self.metas,
                                                  xp))


def _dummy():
    # What a rank without data passes, so that the node is on its graph
    # too and its backward runs the collective's other half.
    return Variable(delegate_array())


def bcast(comm, x, root=0):
    """Differentiable broadcast: ``root``'s ``x`` on every rank.

    Backward gathers the gradients to ``root`` and sums them there.

    Args:
        comm: a :mod:`minichain.dist` communicator (collective).
        x: a Variable or array on ``root``; ignored elsewhere.
        root: the broadcasting rank.
    Returns:
        A Variable of ``x``'s shape and dtype on every rank.
    """
    return Bcast(comm, root).apply((x if comm.rank == root else _dummy(),))[0]


def gather(comm, x, root=0):
    """Differentiable gather: every rank's ``x`` on ``root``.

    Backward scatters the gradients from ``root``.

    Args:
        comm: a :mod:`minichain.dist` communicator (collective).
        x: a Variable or array, of one shape and dtype on every rank.
        root: the gathering rank.
    Returns:
        On ``root``, a tuple of ``comm.size`` Variables (rank ``r``'s ``x``
        at ``r``); elsewhere a delegate variable (empty: call ``backward``
        on it, or join it to the graph with ``pseudo_connect``).
    """
    ys = Gather(comm, root).apply((x,))
    return ys if comm.rank == root else ys[0]


def scatter(comm, xs, root=0):
    """Differentiable scatter: ``xs[r]`` of ``root`` to rank ``r``.

    Backward gathers the gradients to ``root``.

    Args:
        comm: a :mod:`minichain.dist` communicator (collective).
        xs: on ``root``, a tuple or list of ``comm.size`` Variables or
            arrays of one shape and dtype; ignored elsewhere (None).
        root: the scattering rank.
    Returns:
        A Variable: this rank's entry of ``xs``.
    """
    inputs = tuple(xs) if comm.rank == root else (_dummy(),)
    return Scatter(comm, root).apply(inputs)[0]


def allgather(comm, x):
    """Differentiable allgather: every rank's ``x`` on every rank.

    Backward sums each rank's gradients of every ``x`` on its owner (an
    alltoall, then a sum: a reduce-scatter).

    Args:
        comm: a :mod:`minichain.dist` communicator (collective).
        x: a Variable or array, of one shape and dtype on every rank.
    Returns:
        A tuple of ``comm.size`` Variables: rank ``r``'s ``x`` at ``r``.
    """
    return AllGather(comm).apply((x,))


def alltoall(comm, xs):
    """Differentiable all-to-all: ``xs[s]`` goes to rank ``s``.

    Backward sends each gradient back where its array came from (an
    alltoall again).

    Args:
        comm: a :mod:`minichain.dist` communicator (collective).
        xs: a tuple or list of ``comm.size`` Variables or arrays (any
            shapes and dtypes).
    Returns:
        A tuple of ``comm.size`` Variables: entry ``s`` came from rank
        ``s``.
    """
    return AllToAll(comm).apply(tuple(xs))
