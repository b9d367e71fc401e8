"""Gradient-ready hooks: a leaf's gradient announced the moment it is final.

``Variable.register_grad_hook(hook)`` asks backward to call ``hook(leaf)``
once, while backward is still running, as soon as nothing can add to the
leaf's gradient any more. Data-parallel training uses it to start averaging
a layer's gradients while the layers below it are still differentiated
(``minichain.dist.averaging.overlap``).

Why "final" is knowable: a leaf's gradient is a sum with one term per
function that took the leaf as an input, and backward visits functions in
decreasing generation, each exactly once. So before the walk we count, for
every hooked leaf, the functions upstream of the output that use it (its
*pending uses*); after the walk has visited a function, each of its hooked
inputs has one pending use fewer. At zero no function left can contribute:
the gradient is final and the hooks fire. A parameter used twice (a shared
weight) has two pending uses and fires once, after the second. A function
that the walk never reaches (no gradient flows into it) leaves its inputs'
counts above zero; their gradients are final when the walk ends, and they
fire then. A leaf that got nothing in this walk does not fire at all; the
``done`` callbacks, called once at the end of the walk, are where its owner
learns that (``Link.register_grad_hook`` reports those parameters).

A ``between`` callback (``Link.register_grad_hook(..., between=f)``) is
called after every function the walk visits while some of the link's
gradients are not final yet: where a data-parallel owner lets the
collectives it has in flight progress (MPICH moves a non-blocking
collective on only inside MPI calls).

Each backward counts afresh, so ``retain_graph`` and double backprop fire
once per call to ``backward`` (functions created by a double-backprop walk
compute gradients; they are not part of the graph being walked). While no
variable has a hook, a walk only checks that the registry is empty.
"""
import weakref

_hooked = weakref.WeakSet()  # the variables that have hooks


class Handle:
    """What ``register_grad_hook`` returns: ``remove()`` unregisters."""

    def __init__(self, pairs):
        self._pairs = pairs  # [(variable, (hook, done, between))]

    def remove(self):
        """Unregister the hooks (a second call does nothing)."""
        for var, pair in self._pairs:
            var._grad_hooks = tuple(h for h in var._grad_hooks if h is not pair)
            if not var._grad_hooks:
                _hooked.discard(var)
        self._pairs = []


def add_hook(var, hook, done=None, between=None):
    """Register ``(hook, done, between)`` on ``var``; returns a
    :class:`Handle`."""
    pair = (hook, done, between)
    var._grad_hooks = var._grad_hooks + (pair,)
    _hooked.add(var)
    return Handle([(var, pair)])


def add_link_hook(link, hook, done=None, between=None):
    """Hook every parameter of ``link``: ``hook(param)`` when its gradient
    is final; ``done(missing)`` at the end of each backward that reached
    one of them, ``missing`` = the ``[(path, param)]`` that got no gradient
    in that backward (unused, or reached by no gradient); ``between()``
    after each function of such a backward while one of them is pending."""
    params = list(link.namedparams())
    fired = set()

    def ready(param):
        fired.add(id(param))
        hook(param)

    def end():
        missing = [(n, p) for n, p in params if id(p) not in fired]
        fired.clear()
        if done is not None:
            done(missing)
    pairs = []
    for _, p in params:
        pairs.extend(add_hook(p, ready, end, between)._pairs)
    return Handle(pairs)


def _uses(func):
    """``func``'s inputs (VariableNodes) that require a gradient, each once."""
    return {id(x): x for x in func.inputs if x.requires_grad}.values()


class GradReady:
    """One backward walk's pending-use counts (see the module docstring):
    ``visited(func)`` after each function, ``finish()`` at the end."""

    def __init__(self, root):
        # Keyed by id(node) (the walk sees nodes; the hooks sit on the leaf
        # Variable, which the entry holds, so the node stays alive too).
        self.pending = {}    # id(node) -> [leaf Variable, pending uses]
        self.before = {}     # id(node) -> the leaf's gradient before this walk
        self.dones = {}      # id(done) -> done
        self.betweens = {}   # id(between) -> between
        if _hooked:
            self._count(root.creator)

    def _count(self, func):
        seen, stack = set(), [func]
        while stack:
            f = stack.pop()
            if id(f) in seen or f.inputs is None:
                continue
            seen.add(id(f))
            for node in _uses(f):
                if node.creator is not None:
                    stack.append(node.creator)
                    continue
                x = node.get_variable_or_none()
                if x is not None and x._grad_hooks:
                    entry = self.pending.setdefault(id(node), [x, 0])
                    entry[1] += 1
                    self.before[id(node)] = x._grad_var
                    for _, done, between in x._grad_hooks:
                        if done is not None:
                            self.dones[id(done)] = done
                        if between is not None:
                            self.betweens[id(between)] = between

    def visited(self, func):
        """The walk is done with ``func``: its hooked inputs have one
        pending use fewer; fire those that reach zero."""
        if not self.pending:
            return
        for node in _uses(func):
            entry = self.pending.get(id(node))
            if entry is not None:
                entry[1] -= 1
                if entry[1] == 0:
                    del self.pending[id(node)]
                    self._fire(entry[0])
        for between in self.betweens.values():
            between()

    def finish(self):
        """The walk ended: the leaves it did not finish are final too; then
        each ``done`` once."""
        for x, _ in list(self.pending.values()):
            self._fire(x)
        self.pending.clear()
        for done in self.dones.values():
            done()

    def _fire(self, x):
        # Accumulation rebinds the gradient, so a new object means that this
        # walk added to it.
        if x._grad_var is not self.before[id(x._node)]:
            for hook, _, _ in x._grad_hooks:
                hook(x)
