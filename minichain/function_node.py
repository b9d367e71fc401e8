"""FunctionNode: one differentiable operation recorded on the tape.

A subclass writes ``forward(inputs)`` on raw arrays and
``backward(target_input_indexes, grad_outputs)`` that returns Variables built
from *other functions*, so that the gradient itself is differentiable (double
backprop comes for free). ``apply`` runs forward and, when backprop is enabled,
links the node into the graph through the VariableNodes of its inputs (held
strongly: backward walks them) and of its outputs (weakly: a dropped output
must be able to die). Of the arrays it keeps only those that forward declared
with ``retain_inputs``/``retain_outputs``: an activation that no backward
reads is freed as soon as the program drops it, not at backward.
"""
import weakref

import numpy

from minichain import backend, kernel_seam
from minichain.configuration import config


class FunctionNode:
    """Base class of every differentiable operation.

    Attributes:
        inputs: tuple of the inputs' VariableNodes (None until applied with
            backprop, and again after backward freed the graph).
        outputs: tuple of weak references to the outputs' VariableNodes.
        generation: max generation of the inputs; backward visits nodes in
            decreasing generation, so a node runs after all its consumers.
    """

    inputs = None
    outputs = None
    generation = 0
    _input_indexes_to_retain = None
    _output_indexes_to_retain = None
    _retained_input_data = None
    _retained_output_data = None
    _freed = False

    @property
    def label(self):
        """Short name used in error messages and graph dumps."""
        return type(self).__name__

    def apply(self, inputs):
        """Run forward on ``inputs`` (Variables or arrays); return Variables.

        The outputs require a gradient when any input does. The node is linked
        into the graph only when ``config.enable_backprop`` is on and some
        input requires a gradient; then it must not be applied again.
        """
        from minichain.variable import Variable, as_variable
        if self.inputs is not None or self._freed:
            raise RuntimeError('{} was already applied; create a new instance '
                               'for each call'.format(self.label))
        in_vars = tuple(as_variable(x) for x in inputs)
        # The seam: a registered kernel, else the body (kernel_seam.py).
        outputs = kernel_seam.forward(self, tuple(x.array for x in in_vars))
        if not isinstance(outputs, tuple):
            raise TypeError('{}.forward must return a tuple of arrays, got {}'
                            .format(self.label, type(outputs).__name__))
        outputs = tuple(_as_output_array(self.label, y) for y in outputs)
        if config.debug:
            _check_finite(self.label, 'forward output', outputs)
        requires_grad = any(x.requires_grad for x in in_vars)
        out_vars = tuple(Variable(y, requires_grad=requires_grad)
                         for y in outputs)
        if config.enable_backprop and requires_grad:
            self.generation = max(x.generation for x in in_vars)
            # Nodes, not Variables: the graph holds no array by itself.
            self.inputs = tuple(x.node for x in in_vars)
            self.outputs = tuple(weakref.ref(y.node) for y in out_vars)
            for v in in_vars + out_vars:
                v.node._record(v.array)  # to check gradients against
            for y in out_vars:
                y.creator = self
            # The arrays backward reads, and only those.
            if self._input_indexes_to_retain is not None:
                self._retained_input_data = tuple(
                    in_vars[i].array for i in self._input_indexes_to_retain)
            if self._output_indexes_to_retain is not None:
                self._retained_output_data = tuple(
                    outputs[i] for i in self._output_indexes_to_retain)
        return out_vars

    def forward(self, inputs):
        """Compute outputs from input arrays; return a tuple of arrays."""
        raise NotImplementedError(self.label + '.forward')

    def backward(self, target_input_indexes, grad_outputs):
        """Return gradients (Variables or None) for ``target_input_indexes``.

        ``grad_outputs`` holds one Variable (or None) per output. The result
        has one entry per target index, or one per input (then the entries
        that are not targets are ignored).
        """
        raise NotImplementedError(
            '{} does not implement backward'.format(self.label))

    # -- what backward keeps -------------------------------------------------
    def retain_inputs(self, indexes):
        """Declare which inputs backward needs (call inside forward)."""
        self._input_indexes_to_retain = tuple(indexes)

    def retain_outputs(self, indexes):
        """Declare which outputs backward needs (call inside forward)."""
        self._output_indexes_to_retain = tuple(indexes)

    def get_retained_inputs(self):
        """The retained input Variables, in the order given to retain_inputs.

        An input the program has dropped is re-created on its retained array
        with its graph node, so its creator is right and double backprop
        flows through it.
        """
        self._check_not_freed()
        _check_declared(self, self._input_indexes_to_retain, 'inputs')
        return tuple(self.inputs[i].get_variable(data) for i, data in zip(
            self._input_indexes_to_retain, self._retained_input_data))

    def get_retained_outputs(self):
        """The retained output Variables (re-created if the user dropped them).

        A re-created output still has this node as creator, so a gradient
        built from it flows back through this node when double-backpropagated.
        """
        from minichain.variable import Variable
        self._check_not_freed()
        _check_declared(self, self._output_indexes_to_retain, 'outputs')
        result = []
        for i, data in zip(self._output_indexes_to_retain,
                           self._retained_output_data):
            node = self.outputs[i]()
            if node is not None:
                y = node.get_variable(data)
            else:  # no Variable and no consumer left: a new output node
                y = Variable(data)
                y.creator = self
                y.node._record(data)
                refs = list(self.outputs)
                refs[i] = weakref.ref(y.node)
                self.outputs = tuple(refs)
            result.append(y)
        return tuple(result)

    # -- graph management ----------------------------------------------------
    def free(self):
        """Drop inputs and retained arrays so the upstream graph can die."""
        self.inputs = None
        self._retained_input_data = None
        self._retained_output_data = None
        self._freed = True

    def _check_not_freed(self):
        if self._freed:
            raise RuntimeError(
                'the graph through {} was already freed by an earlier '
                'backward(); pass retain_graph=True (or '
                'enable_double_backprop=True) to that call to backpropagate '
                'through it again'.format(self.label))


def _check_declared(func, indexes, what):
    if indexes is None:
        raise RuntimeError('{0}.backward asked for its retained {1}, but '
                           '{0}.forward did not call retain_{1}(...)'
                           .format(func.label, what))


def _as_output_array(label, y):
    """A forward result as an ndarray (NumPy reductions return scalars)."""
    if isinstance(y, numpy.generic):
        return numpy.asarray(y)
    if not backend.is_array(y):
        raise TypeError('{}.forward must return ndarrays, got {}'
                        .format(label, type(y).__name__))
    return y


def _check_finite(label, what, arrays):
    """Debug mode: raise if any array holds NaN, naming the function."""
    for i, a in enumerate(arrays):
        if a is None or not (a.dtype.kind == 'c'
                             or backend.is_float(a.dtype)):
            continue
        xp = backend.get_array_module(a)
        if bool(xp.isnan(a).any()):
            raise RuntimeError(
                'NaN detected in {} {} of {} (shape {}, dtype {})'.format(
                    what, i, label, a.shape, a.dtype))
