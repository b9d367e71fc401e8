"""Point-to-point messages as functions: a graph cut across processes.

A network split over two ranks (rank 0 holds the first layers, rank 1 the
rest) is one graph whose edge between the halves runs over MPI. :func:`send`
and :func:`recv` are that edge as FunctionNodes, and the backward of each is
the opposite message::

    rank 0                                 rank 1
    h = l1(x)                              h = recv(comm, 0)
    d = send(h, comm, 1)   ---- h ---->    loss = f(l2(h))
    d.backward()           <--- gh ----    loss.backward()
    (Send.backward receives gh)            (Recv.backward sends gh)

``send`` returns a *delegate variable*: an empty array whose only content is
its place in the graph. A backward that starts from it (or from anything
computed after it: pass it to the next :func:`recv`, or to
:func:`pseudo_connect`) reaches the Send, which then receives the gradient.
Each rank walks its own graph in reverse order of creation, so the messages
of backward pair up as those of forward did, in the other direction; the
delegate variables order the pieces of one rank's graph that no array joins
(docs/model_parallel.md walks a two-rank pipeline through both passes).
"""
import numpy

from minichain import backend
from minichain.function_node import FunctionNode
from minichain.variable import Variable, as_variable


def delegate_array(xp=numpy):
    """The array of a delegate variable: empty, only a place in the graph."""
    return xp.zeros((0,), numpy.float32)


def zeros_for_none(grads, metas, xp):
    """``grads`` (Variables or None) with each None replaced by zeros of
    its ``(shape, dtype)`` in ``metas``: the other side of a message waits
    for every array, used or not."""
    return tuple(Variable(xp.zeros(*meta), requires_grad=False) if g is None
                 else g for g, meta in zip(grads, metas))


def zeros_like_input(func, i=0):
    """A zero gradient for input ``i`` of ``func``, from what its graph
    node recorded (the array itself is not kept)."""
    x = func.inputs[i]
    return Variable(x.xp.zeros(x.shape, x.dtype), requires_grad=False)


class Message(FunctionNode):
    """A message between this rank and rank ``peer``, with ``tag``."""

    towards = None  # 'to' or 'from', for the label

    def __init__(self, comm, peer, tag):
        self.comm, self.peer, self.tag = comm, peer, tag

    @property
    def label(self):
        return '{} ({} rank {})'.format(type(self).__name__, self.towards,
                                        self.peer)


class Send(Message):
    """Send the inputs, all but the last, to rank ``peer``; the last is a
    dummy that keeps the node on the graph (see :func:`send`)."""

    towards = 'to'

    def forward(self, inputs):
        xs = inputs[:-1]
        self.comm.send(xs if len(xs) > 1 else xs[0], self.peer, self.tag)
        return delegate_array(backend.get_array_module(xs[0])),

    def backward(self, indexes, grad_outputs):
        # The gradients of what was sent come back from where it went.
        gxs = recv(self.comm, self.peer, tag=self.tag, force_tuple=True)
        return gxs + (None,)


class Recv(Message):
    """Receive arrays from rank ``peer``. The one input (a delegate
    variable, or a dummy) only places the node in the graph."""

    towards = 'from'

    def forward(self, inputs):
        ys = self.comm.recv(self.peer, self.tag)
        ys = ys if isinstance(ys, tuple) else (ys,)
        self.metas = [(y.shape, y.dtype) for y in ys]
        return ys

    def backward(self, indexes, grad_outputs):
        # The gradients go back to where the arrays came from, one for each
        # (zeros for an array nothing used: the sender waits for all).
        xp = next(g.xp for g in grad_outputs if g is not None)
        gys = zeros_for_none(grad_outputs, self.metas, xp)
        send(gys, self.comm, self.peer, tag=self.tag)
        return zeros_like_input(self),


class PseudoConnect(FunctionNode):
    """Pass the inputs but the first through unchanged; backward gives the
    first (a delegate variable) a zero gradient, so that the walk goes on
    to the communication behind it."""

    def forward(self, inputs):
        return inputs[1:]

    def backward(self, indexes, grad_outputs):
        return (zeros_like_input(self),) + tuple(grad_outputs)


def send(x, communicator, rank, tag=0):
    """Send ``x`` to process ``rank``; its gradient comes back in backward.

    Args:
        x: a Variable or array, or a tuple or list of them (``recv`` then
            returns a tuple).
        communicator: a :mod:`minichain.dist` communicator.
        rank: the receiving rank (not this one).
        tag: a message tag (an int), to tell apart messages between the
            same two ranks.
    Returns:
        The delegate variable: empty, it holds the graph only. ``backward``
        from it (or from a variable computed after it, see
        :func:`pseudo_connect`) receives the gradient of ``x`` from
        ``rank``: there the matching :func:`recv`'s backward sends it.
    """
    if rank == communicator.rank:
        raise ValueError('send: rank {} cannot send to itself (the message '
                         'would never be received)'.format(rank))
    xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    # A dummy that requires a gradient keeps Send on the graph even when x
    # needs none (raw data): its backward must still receive, or the
    # receiving rank's backward would wait for ever.
    dummy = Variable(delegate_array(as_variable(xs[0]).xp))
    delegate, = Send(communicator, rank, tag).apply(xs + (dummy,))
    return delegate


def recv(communicator, rank, delegate_variable=None, tag=0,
         force_tuple=False):
    """Receive what process ``rank`` sent with :func:`send`; backward sends
    the gradient back to it.

    Args:
        communicator: a :mod:`minichain.dist` communicator.
        rank: the sending rank (not this one).
        delegate_variable: the output of this rank's previous piece of graph
            (a :func:`send`'s delegate variable, a variable received
            earlier), when there is one: the receive then comes after it in
            the graph, so that backward reaches that piece after this one.
        tag: the tag the sender used.
        force_tuple: return a tuple even for one array.
    Returns:
        A Variable (arrays on the current GPU if they were sent from one),
        or a tuple of them if a tuple was sent (or ``force_tuple``).
    """
    if rank == communicator.rank:
        raise ValueError('recv: rank {} cannot receive from itself (nothing '
                         'would ever be sent)'.format(rank))
    if delegate_variable is None:  # a dummy puts Recv on the graph
        delegate_variable = Variable(delegate_array())
    ys = Recv(communicator, rank, tag).apply((delegate_variable,))
    return ys if force_tuple or len(ys) > 1 else ys[0]


def pseudo_connect(delegate_variable, *actual_variables):
    """``actual_variables``, joined to the graph behind ``delegate_variable``.

    The values pass through unchanged; in backward their gradients pass
    through too, and the delegate variable gets a zero gradient, so that
    the walk also reaches the communication that made it (a :func:`send`
    with nothing computed after it, say), after what uses the actual
    variables. :class:`~minichain.dist.MultiNodeChainList` joins its pieces
    with it.

    Args:
        delegate_variable: a Variable (typically a :func:`send`'s output),
            or None (an empty one is made).
        actual_variables: the Variables (or arrays) to pass through.
    Returns:
        A tuple of Variables, one per actual variable.
    """
    if delegate_variable is None:
        delegate_variable = Variable(delegate_array(
            as_variable(actual_variables[0]).xp))
    return PseudoConnect().apply((delegate_variable,) + actual_variables)
