"""VariableNode: a Variable's place in the graph, without its data.

The graph is made of FunctionNodes and VariableNodes, as in Chainer v3+. A
Variable owns its array and its node; the node knows the creator and the
generation, and holds the Variable only weakly. So the graph keeps an array
alive only where a function declared it (``retain_inputs``,
``retain_outputs``), and an activation that no backward reads is freed as
soon as the program drops it.
"""
import weakref

import numpy

from minichain import backend


def _no_variable():
    return None  # stands for a dead weak reference (a copied node)


class VariableNode:
    """A Variable's place in the graph: structure, no data.

    A FunctionNode holds its inputs' nodes strongly and its outputs' nodes
    weakly; an input's node outlives its Variable to route the gradient.

    Attributes:
        creator: the FunctionNode that produced the variable (None: a leaf).
        generation: ``creator.generation + 1``, 0 for a leaf.
        requires_grad, name: the Variable's (kept here, so the graph can
            still tell them after the Variable has died).
        shape, dtype, xp: of the array a function last consumed or produced
            through this node, recorded by ``FunctionNode.apply``: backward
            checks gradients against them after the array is gone.
    """

    def __init__(self, variable, requires_grad, name):
        self._variable = weakref.ref(variable)
        # The class to re-create a dead Variable with (get_variable): kept
        # here rather than imported, since variable.py imports this module.
        self._variable_class = type(variable)
        self.creator = None
        self.generation = 0
        self.requires_grad = requires_grad
        self.name = name
        self.shape = self.dtype = None
        self._on_gpu = False

    def _record(self, array):
        self.shape, self.dtype = array.shape, array.dtype
        # A flag, not the module: nodes are deep-copied with their model
        # (Parameters are inputs), and a module cannot be copied.
        self._on_gpu = backend.get_array_module(array) is not numpy

    @property
    def xp(self):
        """``numpy`` or ``cupy``: where the recorded array lived."""
        return backend.cupy if self._on_gpu else numpy  # no device check

    def get_variable_or_none(self):
        """The Variable, if something still holds it; else None."""
        return self._variable()

    def get_variable(self, data):
        """The Variable; if it has died, a new one on ``data`` (a retained
        array) that shares this node, so its creator and generation are
        right and a graph built on it flows back through this node."""
        var = self._variable()
        if var is None:
            var = self._variable_class(data)
            var._node = self  # name, requires_grad and creator come along
            self._variable = weakref.ref(var)
        return var

    def __getstate__(self):
        # A weak reference cannot be copied or pickled; Variable.__setstate__
        # links the copy of a variable to the copy of its node.
        state = self.__dict__.copy()
        state['_variable'] = _no_variable
        return state
