"""Where the layers hook into the protocol.

The protocol (communicator_base.py, flat.py, ring.py, averaging/...) calls
the hooks below. Here each does nothing; a layer fills them when it is
installed, by one line of ``minichain/dist/__init__.py`` marked
``# layer: NAME`` (docs/dist.md, "The layers", shows which fills which).
Delete a layer's folder and its line, and the protocol still runs.

* :func:`span` -- a ``with`` block around one step (pack, allreduce, a
  bucket in flight...), :func:`mark` -- an instant (a gradient became
  final): the trace layer records them on its timeline.
* :data:`layers` -- the classes :func:`minichain.dist.create_communicator`
  puts in front of a communicator class, outermost first: the trace,
  guards and transports layers append theirs, in the order of their lines.
  Each replaces a few of the protocol's own methods (``make_wire``,
  ``header``, ``plan_grads``, ``packed_buffer``, ``pieces``...; see
  communicator_base.py) and calls them through ``super()``.
* :data:`names` -- public names a layer adds to ``minichain.dist``, such as
  the guards' ``check_same_model`` or the trace's ``explain``.
"""

layers = []
names = {}


class NoSpan:
    """What :func:`span` returns: a ``with`` block that does nothing (also
    started and stopped by hand, for a step that ends in another call)."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return None

    def start(self):
        return self

    def stop(self):
        return None


NO_SPAN = NoSpan()


def no_span(name, nbytes=None, sync=False):
    """A step of the protocol: ``name`` (``'pack'``, ``'allreduce'``...),
    the bytes it moves, and whether a GPU must be waited for at its ends
    to time it; never timed (for a step timed in one caller and not in
    another)."""
    return NO_SPAN


span = no_span  # the trace layer puts its timeline's span here


def mark(name, nbytes=None):
    """An instant of the protocol (``'grad'``: a gradient became final).
    Here: nothing."""
