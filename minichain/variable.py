"""Variable, Parameter and the generation-ordered backward walk.

A Variable wraps an array; its VariableNode (variable_node.py) is its place
in the graph: the FunctionNode that created it, the generation.
``backward()`` seeds the output gradient and visits creators from the highest
generation down, so that a node runs only after every consumer of its outputs
has delivered its gradient (a diamond graph is differentiated once per node).
"""
import heapq
import itertools
import weakref

import numpy

from minichain import _grad_ready, backend
from minichain.configuration import config, using_config
from minichain.variable_node import VariableNode


def _array_attribute(name):
    """A read-only property forwarding to the data array's attribute."""
    def get(self):
        if self._data is None:
            raise AttributeError(
                '{} {} is not initialized yet, so it has no {}; call '
                'initialize(shape) first'.format(type(self).__name__,
                                                  self._label(), name))
        return getattr(self._data, name)
    return property(get, doc='``{}`` of the data array.'.format(name))


def _node_attribute(name, doc):
    """A property reading and writing the VariableNode's attribute."""
    return property(lambda self: getattr(self._node, name),
                    lambda self, value: setattr(self._node, name, value),
                    doc=doc)


class Variable:
    """An array with a gradient and a link to the function that made it.

    Args:
        data: a NumPy or CuPy ndarray (or None, for a Parameter not yet
            initialized).
        requires_grad: whether backward computes a gradient for it.
        name: optional name shown in ``repr`` and error messages.
    """

    # Make NumPy defer to our reflected operators: ``ndarray * Variable``
    # then calls Variable.__rmul__ and returns a Variable.
    __array_ufunc__ = None
    __array_priority__ = 200
    _grad_hooks = ()  # ((hook, done, between), ...): register_grad_hook

    def __init__(self, data=None, requires_grad=True, name=None):
        if data is not None and not backend.is_array(data):
            if isinstance(data, numpy.generic):
                data = numpy.asarray(data)
            else:
                raise TypeError(
                    'Variable: data must be a NumPy or CuPy ndarray, got {} '
                    '(wrap it with numpy.asarray first)'.format(
                        type(data).__name__))
        self._data = data
        self._node = VariableNode(self, requires_grad, name)
        self._grad_var = None

    # -- data and gradient ----------------------------------------------------
    @property
    def array(self):
        """The underlying ndarray."""
        return self._data

    @array.setter
    def array(self, value):
        self._data = value

    data = array  # Chainer's historical alias

    @property
    def grad(self):
        """The gradient as an ndarray, or None."""
        return None if self._grad_var is None else self._grad_var.array

    @grad.setter
    def grad(self, g):
        if g is None:
            self._grad_var = None
            return
        self._check_grad(g, 'Variable.grad setter')
        self._grad_var = Variable(g, requires_grad=False)

    @property
    def grad_var(self):
        """The gradient as a Variable (it has a graph after double backprop)."""
        return self._grad_var

    @grad_var.setter
    def grad_var(self, g):
        if g is not None:
            self._check_grad(g.array, 'Variable.grad_var setter')
        self._grad_var = g

    def _check_grad(self, g, where):
        data = self._data
        # The common case in two comparisons: this runs for every
        # parameter at every step (the gradient averaging sets them all).
        if data is None or (type(g) is type(data) is numpy.ndarray
                            and g.dtype == data.dtype
                            and g.shape == data.shape):
            return
        _check_grad_type(where, 'variable ' + self._label(), self, g)

    # -- its place in the graph (kept on the node, see VariableNode) ---------
    @property
    def node(self):
        """The VariableNode that stands for this variable in the graph."""
        return self._node

    @property
    def creator(self):
        """The FunctionNode that produced this variable (None for a leaf)."""
        return self._node.creator

    @creator.setter
    def creator(self, func):
        self._node.creator = func
        if func is not None:
            self._node.generation = func.generation + 1

    generation = property(lambda self: self._node.generation,
                          doc='``creator.generation + 1``; 0 for a leaf.')

    requires_grad = _node_attribute(
        'requires_grad', 'Whether backward computes a gradient for this '
        'variable.')
    name = _node_attribute(
        'name', 'Optional name shown in ``repr``, error messages and graphs.')

    # -- array-like attributes ------------------------------------------------
    shape = _array_attribute('shape')
    ndim = _array_attribute('ndim')
    size = _array_attribute('size')
    dtype = _array_attribute('dtype')
    xp = property(lambda self: backend.get_array_module(self._data),
                  doc='``numpy`` or ``cupy``, wherever the data lives.')

    def __len__(self):
        return len(self._data)

    def _label(self):
        return repr(self.name) if self.name else '(unnamed)'

    def __repr__(self):
        if self._data is None:
            return 'variable(uninitialized, name={!r})'.format(self.name)
        body = numpy.array2string(backend.to_cpu(self._data), separator=', ',
                                  prefix='variable(', threshold=20)
        extra = ', name={!r}'.format(self.name) if self.name else ''
        return 'variable({}, shape={}, dtype={}{})'.format(
            body, self.shape, self.dtype, extra)

    # -- graph operations -----------------------------------------------------
    def cleargrad(self):
        """Set the gradient to None (the next backward writes a fresh one)."""
        self._grad_var = None

    def zerograd(self):
        """Set the gradient to zeros of the variable's shape."""
        self._grad_var = Variable(self.xp.zeros_like(self._data),
                                  requires_grad=False)

    def unchain(self):
        """Cut the link to the creator: this variable becomes a leaf."""
        self._node.creator = None

    def unchain_backward(self):
        """Cut every creator link upstream of this variable (truncated BPTT).

        Afterwards this variable and every variable it was computed from are
        leaves; their data stays, the functions between them can be freed.
        """
        seen = set()
        stack = [self._node]
        while stack:
            v = stack.pop()
            f = v.creator
            v.creator = None
            if f is None or id(f) in seen or f.inputs is None:
                continue
            seen.add(id(f))
            stack.extend(f.inputs)

    def register_grad_hook(self, hook, done=None, between=None):
        """Call ``hook(self)`` during each backward, once, as soon as the
        gradient of this leaf is final (every function that used it has run
        its backward; see :mod:`minichain._grad_ready` for why that is
        known), while backward goes on with the functions below.

        Args:
            hook: called with this variable; its ``grad`` is final. Not
                called in a backward that adds nothing to the gradient.
            done: optional; called once at the end of every backward that
                reached this variable, after every hook of that backward (a
                ``done`` shared by several variables is called once).
            between: optional; called after every function that such a
                backward visits while this gradient is not final yet
                (shared likewise): a place to let communication progress.
        Returns:
            A handle; ``handle.remove()`` unregisters the hook.

        For the parameters of a whole model see
        :meth:`minichain.Link.register_grad_hook`. Hooks are not copied with
        the variable (``copy``, ``deepcopy``, pickling).
        """
        return _grad_ready.add_hook(self, hook, done, between)

    def __getstate__(self):
        # A hook belongs to whoever registered it (a communicator, say), not
        # to a copy of the variable.
        state = self.__dict__.copy()
        state.pop('_grad_hooks', None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        # A deep copy or an unpickled variable comes with a copy of its node
        # that points nowhere (VariableNode.__getstate__): link the two. A
        # shallow copy shares the original's node and leaves it as it is.
        if self._node.get_variable_or_none() is None:
            self._node._variable = weakref.ref(self)

    def to_cpu(self):
        """Move data and gradient to host memory, in place."""
        self._data = backend.to_cpu(self._data)
        if self._grad_var is not None:
            self._grad_var._data = backend.to_cpu(self._grad_var._data)
        return self

    def to_gpu(self, device=None):
        """Move data and gradient to the GPU ``device``, in place."""
        self._data = backend.to_gpu(self._data, device)
        if self._grad_var is not None:
            self._grad_var._data = backend.to_gpu(self._grad_var._data, device)
        return self

    def backward(self, retain_grad=False, enable_double_backprop=False,
                 retain_graph=False):
        """Compute gradients of this variable w.r.t. every leaf upstream.

        Args:
            retain_grad: keep the gradients of intermediate variables (by
                default only leaves and this variable keep theirs).
            enable_double_backprop: build a graph of the gradient computation
                so that gradients can be differentiated again.
            retain_graph: keep the graph for another backward. By default each
                function drops its inputs' nodes and the arrays it retained
                once it has run, so activations die as soon as they are no
                longer needed (a lower memory peak).

        Gradients of leaves accumulate across calls until ``cleargrad``; an
        intermediate variable's gradient is recomputed by each call.

        Raises:
            TypeError: this variable is not floating point.
            ValueError: this variable has more than one element and no
                gradient was set (``y.grad = ...``) before the call.
            RuntimeError: the graph was freed by an earlier backward.
        """
        if self._node.creator is None:
            return
        if self._data.dtype.kind != 'c' and not backend.is_float(
                self._data.dtype):
            raise TypeError(
                'Variable.backward: variable {} has dtype {}: integers and '
                'booleans cannot be differentiated (only floating-point '
                'Variables have gradients)'.format(self._label(), self.dtype))
        if self._grad_var is None:
            # A scalar seeds 1; an empty variable (the delegate variable of
            # minichain.dist.functions) seeds its empty gradient, so that
            # backward reaches the communication that made it.
            if self._data.size > 1:
                raise ValueError(
                    'Variable.backward: variable {} has shape {}; backward '
                    'without a gradient needs a single element (or none). Set '
                    '`y.grad` first, or reduce to a scalar (e.g. F.sum).'
                    .format(self._label(), self.shape))
            self._grad_var = Variable(self.xp.ones_like(self._data),
                                      requires_grad=False)
        keep_graph = retain_graph or enable_double_backprop
        with using_config('enable_backprop', enable_double_backprop):
            _backward_walk(self, retain_grad, keep_graph)


def _backward_walk(root, retain_grad, keep_graph):
    """Visit creators in decreasing generation; accumulate input gradients.

    The walk goes over nodes (VariableNode): an intermediate Variable may be
    gone, so its gradient is summed in ``grads`` until its creator has run.
    Leaves accumulate on their Variable (if still alive: a gradient nobody
    can read is dropped).
    """
    heap, queued, tiebreak = [], set(), itertools.count()
    grads = {}  # node -> its gradient in this walk, until its creator runs
    ready = _grad_ready.GradReady(root)  # fires the gradient-ready hooks

    def push(func):
        if id(func) not in queued:
            queued.add(id(func))
            heapq.heappush(heap, (-func.generation, next(tiebreak), func))

    push(root.creator)
    while heap:
        func = heapq.heappop(heap)[2]
        func._check_not_freed()
        outputs = [ref() for ref in func.outputs]  # nodes, None if dead
        # An output this walk gave nothing to offers the gradient its
        # Variable holds: the root's seed, or one set by hand.
        grad_outputs = tuple(
            None if y is None else grads.pop(y) if y in grads
            else _grad_of(y.get_variable_or_none()) for y in outputs)
        targets = tuple(i for i, x in enumerate(func.inputs) if x.requires_grad)
        if targets and any(g is not None for g in grad_outputs):
            grad_inputs = _call_backward(func, targets, grad_outputs)
            for i, gx in zip(targets, grad_inputs):
                if gx is None:
                    continue
                x = func.inputs[i]
                _check_grad_type(func.label + '.backward',
                                 'input {}'.format(i), x, gx.array)
                if config.debug:
                    _check_nan(func, i, gx.array)
                # Rebind, never +=: the old gradient may be shared.
                if x.creator is None:
                    # A leaf accumulates across calls, until cleargrad.
                    var = x.get_variable_or_none()
                    if var is not None:
                        var._grad_var = (gx if var._grad_var is None
                                         else var._grad_var + gx)
                elif x in grads:
                    grads[x] = grads[x] + gx
                else:
                    # An intermediate starts afresh in each walk (a gradient
                    # kept by retain_grad earlier must not leak into this).
                    grads[x] = gx
                    push(x.creator)
        for y, gy in zip(outputs, grad_outputs):
            var = None if y is None else y.get_variable_or_none()
            if var is not None and var is not root:
                var._grad_var = gy if retain_grad else None
        ready.visited(func)
        if not keep_graph:
            func.free()
    ready.finish()


def _grad_of(var):
    return None if var is None else var._grad_var


def _call_backward(func, targets, grad_outputs):
    """Run func.backward and normalise its result to one Variable per target."""
    result = func.backward(targets, grad_outputs)
    if not isinstance(result, (tuple, list)):
        result = (result,)
    if len(result) == len(func.inputs) and len(result) != len(targets):
        result = tuple(result[i] for i in targets)
    if len(result) != len(targets):
        raise ValueError(
            '{}.backward returned {} gradients for {} requested inputs'
            .format(func.label, len(result), len(targets)))
    return tuple(None if g is None else as_variable(g) for g in result)


def _check_grad_type(where, what, x, g):
    """Raise unless gradient array ``g`` matches ``x`` (a Variable, or a
    VariableNode: what its array was) in device, dtype and shape.

    Checked on every gradient, not only in debug mode: it needs no device
    synchronisation, and a wrong shape would broadcast silently into the sum.
    """
    if backend.get_array_module(g) is not x.xp:
        raise TypeError('{}: gradient for {} is a {} but its data is a {} '
                        'array'.format(where, what, type(g).__name__,
                                       x.xp.__name__))
    if g.dtype != x.dtype or g.shape != x.shape:
        raise (TypeError if g.dtype != x.dtype else ValueError)(
            '{}: gradient for {} has shape {} dtype {}, but {} has shape {} '
            'dtype {}'.format(where, what, g.shape, g.dtype, what, x.shape,
                              x.dtype))


def _check_nan(func, index, g):
    """Debug mode: NaN in a gradient raises, naming the function."""
    xp = backend.get_array_module(g)
    if (g.dtype.kind == 'c' or backend.is_float(g.dtype)) and bool(
            xp.isnan(g).any()):
        raise RuntimeError('NaN detected in the gradient of input {} of {} '
                           '(shape {})'.format(index, func.label, g.shape))


class Parameter(Variable):
    """A trainable Variable that an initializer may fill lazily.

    Args:
        initializer: an initializer object, a scalar or an array. An array
            becomes the data at once; otherwise the data is created when the
            shape is known (``initialize(shape)``). None gives NaN data (so
            that a forgotten initialization shows up at once).
        shape: if given, initialize immediately.
        name: the parameter's name inside its link.
    """

    def __init__(self, initializer=None, shape=None, name=None):
        self.update_rule = None  # set by the optimizer that owns it
        self._device = -1  # where lazy initialization puts the data
        self._zero_grad_on_init = False
        if backend.is_array(initializer):
            super().__init__(initializer, name=name)
            self.initializer = None
        else:
            super().__init__(None, name=name)
            self.initializer = initializer
            if shape is not None:
                self.initialize(shape)

    def initialize(self, shape):
        """Create the data of ``shape`` with this parameter's initializer.

        The array is generated on the host (the same values on every device
        and process for a given seed), then moved where the parameter lives.
        """
        from minichain import initializers
        data = initializers.generate_array(self.initializer, shape, numpy)
        if self._device >= 0:
            data = backend.to_gpu(data, self._device)
        self._data = data
        self._grad_var = None
        if self._zero_grad_on_init:
            self._zero_grad_on_init = False
            self.zerograd()

    def zerograd(self):
        """Zero the gradient; if uninitialized, do so once data exists."""
        if self._data is None:
            self._zero_grad_on_init = True
        else:
            super().zerograd()

    def cleargrad(self):
        """Set the gradient to None (also cancels a deferred zerograd)."""
        self._zero_grad_on_init = False
        super().cleargrad()

    def to_cpu(self):
        """Move data and gradient to the host (later initialization too)."""
        self._device = -1
        return super().to_cpu() if self._data is not None else self

    def to_gpu(self, device=None):
        """Move data and gradient to GPU ``device`` (later initialization
        too); None means the current device."""
        cupy = backend.get_cupy()
        self._device = cupy.cuda.Device(device).id
        return super().to_gpu(self._device) if self._data is not None else self

    @property
    def is_initialized(self):
        """True once the parameter has data."""
        return self._data is not None

    def __repr__(self):
        return 'parameter' + super().__repr__()[len('variable'):]


def as_variable(x):
    """Return ``x`` if it is a Variable, else wrap the array (no gradient)."""
    if isinstance(x, Variable):
        return x
    return Variable(x, requires_grad=False)


def as_array(x, like=None):
    """Turn a scalar or array into an ndarray, using ``like``'s dtype and
    device for Python and NumPy scalars (so ``x * 2`` keeps float32)."""
    if isinstance(x, Variable):
        return x.array
    if backend.is_array(x):
        return x
    if like is not None:
        return backend.get_array_module(like).asarray(x, dtype=like.dtype)
    return numpy.asarray(x)
