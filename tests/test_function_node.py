"""The backward walk: order, accumulation, freeing, double backprop, checks."""
import gc
import weakref

import numpy
import pytest

import minichain
import minichain.functions as F
from minichain import FunctionNode, Variable


class Scale(FunctionNode):
    """y = c * x; logs every backward call into ``log``."""

    def __init__(self, c, log=None, tag=None):
        self.c, self.log, self.tag = c, log, tag

    def forward(self, inputs):
        return inputs[0] * inputs[0].dtype.type(self.c),

    def backward(self, indexes, grad_outputs):
        if self.log is not None:
            self.log.append((self.tag, self.generation))
        return grad_outputs[0] * self.c,


class Add2(FunctionNode):
    """y = a + b; logs every backward call into ``log``."""

    def __init__(self, log=None, tag=None):
        self.log, self.tag = log, tag

    def forward(self, inputs):
        return inputs[0] + inputs[1],

    def backward(self, indexes, grad_outputs):
        if self.log is not None:
            self.log.append((self.tag, self.generation))
        gy, = grad_outputs
        return gy, gy  # one per input; the walk keeps the targets


def scale(x, c, log=None, tag=None):
    return Scale(c, log, tag).apply((x,))[0]


def add2(a, b, log=None, tag=None):
    return Add2(log, tag).apply((a, b))[0]


def leaf(*values, dtype=numpy.float64):
    return Variable(numpy.array(values, dtype=dtype))


def test_diamond_each_node_once_in_generation_order():
    log = []
    x = leaf(1.0, 2.0)
    a = scale(x, 2, log, 'a')
    b = scale(a, 3, log, 'b')
    c = scale(a, 5, log, 'c')
    y = add2(b, c, log, 'y')
    y.grad = numpy.ones(2)
    y.backward()
    assert sorted(tag for tag, _ in log) == ['a', 'b', 'c', 'y']
    assert log[0][0] == 'y' and log[-1][0] == 'a'
    numpy.testing.assert_allclose(x.grad, [16.0, 16.0])


def test_unbalanced_diamond_waits_for_the_long_branch():
    # a feeds a short branch (1 node) and a long one (3 nodes): a breadth-
    # first walk would run a's creator before the long branch delivered.
    log = []
    x = leaf(1.0)
    a = scale(x, 2, log, 'a')
    long_ = scale(scale(scale(a, 1, log, 'l1'), 1, log, 'l2'), 1, log, 'l3')
    y = add2(long_, scale(a, 1, log, 's'), log, 'y')
    y.backward()
    tags = [tag for tag, _ in log]
    assert sorted(tags) == ['a', 'l1', 'l2', 'l3', 's', 'y']
    assert tags[-1] == 'a'
    gens = [g for _, g in log]
    assert gens == sorted(gens, reverse=True)
    numpy.testing.assert_allclose(x.grad, [4.0])


def test_same_variable_twice_accumulates():
    x = leaf(3.0, -1.0)
    y = add2(x, x)
    y.grad = numpy.ones(2)
    y.backward()
    numpy.testing.assert_allclose(x.grad, [2.0, 2.0])
    x.cleargrad()
    F.sum(x * x).backward()
    numpy.testing.assert_allclose(x.grad, [6.0, -2.0])


def test_accumulation_rebinds_instead_of_adding_in_place():
    x = leaf(1.0)
    first = numpy.array([10.0])
    x.grad = first
    scale(x, 2).backward()
    numpy.testing.assert_allclose(x.grad, [12.0])
    numpy.testing.assert_allclose(first, [10.0])  # the old array is intact


def test_leaf_gradients_accumulate_across_backward_calls():
    x = leaf(2.0)
    F.sum(x * x).backward()
    F.sum(x * x).backward()
    numpy.testing.assert_allclose(x.grad, [8.0])
    x.cleargrad()
    assert x.grad is None


def test_retain_grad_keeps_intermediate_gradients():
    x = leaf(1.0, 2.0)
    h = scale(x, 3)
    y = F.sum(h * h)
    y.backward()
    assert h.grad is None
    assert y.grad is not None  # the root keeps its seed

    h = scale(x, 3)
    y = F.sum(h * h)
    y.backward(retain_grad=True)
    numpy.testing.assert_allclose(h.grad, 2 * h.array)


def test_intermediate_gradient_recomputed_not_accumulated():
    x = leaf(1.0)
    h = scale(x, 3)
    y = scale(h, 2)
    y.backward(retain_grad=True, retain_graph=True)
    y.backward(retain_grad=True)
    numpy.testing.assert_allclose(h.grad, [2.0])   # afresh each call
    numpy.testing.assert_allclose(x.grad, [12.0])  # leaf: 6 + 6


def test_no_backprop_mode_builds_no_graph_and_force_restores_it():
    x = leaf(1.0)
    with minichain.no_backprop_mode():
        y = x * 2
        assert y.creator is None
        with minichain.force_backprop_mode():
            z = x * 2
        w = x * 2
    assert z.creator is not None
    assert w.creator is None
    assert (x * 2).creator is not None


def test_outputs_require_grad_only_when_an_input_does():
    c = Variable(numpy.ones(2), requires_grad=False)
    y = scale(c, 2)
    assert not y.requires_grad and y.creator is None
    assert scale(leaf(1.0), 2).requires_grad


def test_graph_is_freed_after_backward():
    x = leaf(1.0, 2.0)
    h = scale(x, 2)
    node = weakref.ref(h.creator)
    h_ref = weakref.ref(h)
    y = F.sum(scale(h, 3))
    del h
    y.backward()
    # No cycles in the graph: reference counting alone frees it.
    assert h_ref() is None and node() is None
    numpy.testing.assert_allclose(x.grad, [6.0, 6.0])


def test_retain_graph_keeps_the_graph():
    x = leaf(1.0)
    h = scale(x, 2)
    h_ref = weakref.ref(h.node)  # the graph keeps h's node, not h
    y = F.sum(scale(h, 3))
    del h
    y.backward(retain_graph=True)
    gc.collect()
    assert h_ref() is not None
    y.backward()
    numpy.testing.assert_allclose(x.grad, [12.0])


def test_second_backward_without_retain_graph_raises():
    x = leaf(1.0)
    y = F.sum(scale(scale(x, 2), 3))
    y.backward()
    with pytest.raises(RuntimeError, match='retain_graph=True'):
        y.backward()


def test_double_backprop_of_cube():
    x = leaf(0.5, -2.0, 3.0)
    y = F.sum(x ** 3)
    y.backward(enable_double_backprop=True)
    gx = x.grad_var
    numpy.testing.assert_allclose(gx.array, 3 * x.array ** 2)
    assert gx.creator is not None
    x.cleargrad()
    F.sum(gx).backward()
    numpy.testing.assert_allclose(x.grad, 6 * x.array)


def test_double_backprop_of_tanh():
    x = leaf(0.3, -1.2, 2.0)
    F.sum(F.tanh(x)).backward(enable_double_backprop=True)
    gx = x.grad_var
    t = numpy.tanh(x.array)
    numpy.testing.assert_allclose(gx.array, 1 - t ** 2)
    x.cleargrad()
    F.sum(gx).backward()
    numpy.testing.assert_allclose(x.grad, -2 * t * (1 - t ** 2))


def test_backward_of_non_scalar_without_grad_raises():
    y = scale(Variable(numpy.ones((2, 3)), name='h'), 2)
    with pytest.raises(ValueError, match=r'\(2, 3\)'):
        y.backward()


def test_get_item_backward_with_repeated_indices():
    x = leaf(1.0, 2.0, 3.0)
    F.sum(x[numpy.array([0, 0, 2, 0])]).backward()
    numpy.testing.assert_allclose(x.grad, [3.0, 0.0, 1.0])


class WrongGrad(FunctionNode):
    """Identity whose backward returns ``self.bad`` (a planted bug)."""

    def __init__(self, bad):
        self.bad = bad

    def forward(self, inputs):
        return inputs[0].copy(),

    def backward(self, indexes, grad_outputs):
        return Variable(self.bad),


def test_gradient_of_wrong_shape_names_the_function():
    x = leaf(1.0, 2.0)
    y = WrongGrad(numpy.ones(3)).apply((x,))[0]
    y.grad = numpy.ones(2)
    with minichain.using_config('debug', True):
        with pytest.raises(ValueError, match=r'WrongGrad.*\(3,\).*\(2,\)'):
            y.backward()


def test_gradient_of_wrong_dtype_names_the_function():
    x = leaf(1.0, 2.0, dtype=numpy.float32)
    y = WrongGrad(numpy.ones(2)).apply((x,))[0]  # float64 gradient
    y.grad = numpy.ones(2, numpy.float32)
    with minichain.using_config('debug', True):
        with pytest.raises(TypeError, match='WrongGrad.*float64.*float32'):
            y.backward()


def test_nan_in_gradient_raises_in_debug_mode_only():
    def run():
        x = leaf(1.0, 2.0)
        y = WrongGrad(numpy.array([0.0, numpy.nan])).apply((x,))[0]
        y.grad = numpy.ones(2)
        y.backward()
        return x
    assert numpy.isnan(run().grad[1])
    with minichain.using_config('debug', True):
        with pytest.raises(RuntimeError, match='NaN.*WrongGrad'):
            run()


class Log(FunctionNode):
    def forward(self, inputs):
        with numpy.errstate(invalid='ignore'):
            return numpy.log(inputs[0]),


def test_nan_in_forward_raises_in_debug_mode():
    with minichain.using_config('debug', True):
        with pytest.raises(RuntimeError, match='NaN.*Log'):
            Log().apply((leaf(-1.0),))


class TwoOutputs(FunctionNode):
    """(2x, 3x); backward reads the retained second output."""

    def forward(self, inputs):
        self.retain_outputs((1,))
        x, = inputs
        return 2 * x, 3 * x

    def backward(self, indexes, grad_outputs):
        y1, = self.get_retained_outputs()
        g0, g1 = grad_outputs
        assert g1 is None  # the second output was not used
        return g0 * 2 + 0 * y1,


def test_dropped_retained_output_is_recreated_and_unused_grad_is_none():
    x = leaf(1.0, 2.0)
    y0 = TwoOutputs().apply((x,))[0]  # y1 dies here: outputs held weakly
    F.sum(y0).backward()
    numpy.testing.assert_allclose(x.grad, [2.0, 2.0])


class NoDeclare(FunctionNode):
    def forward(self, inputs):
        return inputs[0].copy(),

    def backward(self, indexes, grad_outputs):
        return self.get_retained_inputs()


def test_contract_errors_name_the_function():
    with pytest.raises(RuntimeError, match='NoDeclare.*retain_inputs'):
        F.sum(NoDeclare().apply((leaf(1.0),))[0]).backward()

    node = Scale(2)
    node.apply((leaf(1.0),))
    with pytest.raises(RuntimeError, match='Scale was already applied'):
        node.apply((leaf(1.0),))

    class NotTuple(FunctionNode):
        def forward(self, inputs):
            return inputs[0]
    with pytest.raises(TypeError, match='NotTuple.forward must return a tuple'):
        NotTuple().apply((leaf(1.0),))

    class TooMany(Scale):
        def backward(self, indexes, grad_outputs):
            return grad_outputs[0], grad_outputs[0], grad_outputs[0]
    with pytest.raises(ValueError, match='TooMany.backward returned 3'):
        F.sum(TooMany(2).apply((leaf(1.0),))[0]).backward()


def test_forward_scalar_result_becomes_an_array():
    class SumAll(FunctionNode):
        def forward(self, inputs):
            return inputs[0].sum(),  # a NumPy scalar, not an array
    y = SumAll().apply((leaf(1.0, 2.0),))[0]
    assert isinstance(y.array, numpy.ndarray) and y.shape == ()


def _conv_relu_conv(x, W1, W2):
    """conv -> relu -> conv -> relu -> sum, and the three intermediates."""
    h = F.convolution_2d(x, W1, pad=1)   # keeps x and W1, not h
    y = F.relu(h)                        # keeps y, not h
    k = F.convolution_2d(y, W2, pad=1)   # keeps y and W2, not k
    return F.sum(F.relu(k)), h, y, k


def test_graph_keeps_only_the_arrays_that_functions_retained():
    rng = numpy.random.RandomState(0)
    arrays = (rng.randn(2, 3, 5, 5), rng.randn(4, 3, 3, 3),
              rng.randn(4, 4, 3, 3))
    x, W1, W2 = (Variable(a) for a in arrays)
    loss, h, y, k = _conv_relu_conv(x, W1, W2)
    h_ref, y_ref, k_ref = (weakref.ref(v.array) for v in (h, y, k))
    del h, y, k
    gc.collect()
    # No function retained h or k: the graph lets them go at once. y is
    # relu's retained output and the second convolution's retained input.
    assert h_ref() is None and k_ref() is None
    assert y_ref() is not None
    assert loss.creator.inputs[0].creator.inputs[0].creator.inputs[0] \
        .creator.inputs[0].creator is not None      # the graph is whole
    loss.backward()
    assert y_ref() is None  # backward freed the graph as it went
    # The same gradients as with every intermediate still held by name.
    refs = [Variable(a) for a in arrays]
    _conv_relu_conv(*refs)[0].backward()
    for v, r in zip((x, W1, W2), refs):
        numpy.testing.assert_allclose(v.grad, r.grad, rtol=1e-12)


def test_double_backprop_through_dropped_retained_variables():
    # Mul re-creates h from its retained array, Exp re-creates its retained
    # output: both must carry Exp as creator, or the second derivative
    # misses the path through exp.
    x = leaf(0.3, -0.7)
    h = F.exp(x)
    z = F.sum(h * h)          # sum(exp(2x))
    del h
    z.backward(enable_double_backprop=True)
    gx = x.grad_var
    numpy.testing.assert_allclose(gx.array, 2 * numpy.exp(2 * x.array))
    x.cleargrad()
    F.sum(gx).backward()
    numpy.testing.assert_allclose(x.grad, 4 * numpy.exp(2 * x.array))


def test_copies_of_a_variable_get_their_own_graph_node():
    import copy
    import pickle
    v = Variable(numpy.ones(2), name='v')
    for c in (copy.deepcopy(v), pickle.loads(pickle.dumps(v))):
        assert c.node is not v.node and c.node.get_variable_or_none() is c
        assert c.name == 'v' and v.node.get_variable_or_none() is v
    shallow = copy.copy(v)  # shares the node, which stays v's
    assert shallow.node is v.node and v.node.get_variable_or_none() is v


def test_a_model_used_once_deep_copies():
    # Its parameters' nodes have recorded their arrays: nothing in a node
    # may refuse to be copied (a module would).
    import copy
    W = Variable(numpy.ones((2, 2)), name='W')
    F.sum(W * 2).backward()
    twin = copy.deepcopy(W)
    assert twin.node.dtype == W.dtype and twin.node.xp is numpy
