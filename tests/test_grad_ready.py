"""Gradient-ready hooks (minichain/_grad_ready.py): each leaf fires once
per backward, as soon as its gradient is final, while backward goes on."""
import copy

import numpy
import pytest

import minichain
import minichain.functions as F
from minichain import FunctionNode, Parameter, Variable
from minichain import links as L


class _Tap(FunctionNode):
    """The identity; its backward writes ``name`` into ``log``."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def forward(self, inputs):
        return inputs[0],

    def backward(self, indexes, grad_outputs):
        self.log.append(self.name)
        return grad_outputs[0],


class _Drop(FunctionNode):
    """The identity whose backward passes no gradient on."""

    def forward(self, inputs):
        return inputs[0],

    def backward(self, indexes, grad_outputs):
        return None,


def _tap(x, log, name):
    return _Tap(log, name).apply((x,))[0]


class _Net(minichain.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(3, 4)
            self.l2 = L.Linear(4, 2)
            self.unused = Parameter(numpy.zeros(2, numpy.float32))

    def forward(self, x, log):
        h = _tap(F.tanh(self.l1(x)), log, 'below l2')
        return F.sum(self.l2(h) ** 2)


def _logging_hooks(link, log):
    names = {id(p): n for n, p in link.namedparams()}
    reports = []
    handle = link.register_grad_hook(
        lambda p: log.append(names[id(p)]),
        lambda missing: reports.append([n for n, _ in missing]))
    return handle, reports


def test_each_parameter_fires_once_as_soon_as_final_in_reverse_order():
    net, log = _Net(), []
    _, reports = _logging_hooks(net, log)
    x = Variable(numpy.ones((5, 3), numpy.float32))
    net.cleargrads()
    net(_tap(x, log, 'input'), log).backward()
    # l2's gradients are final before backward reaches the layers below it;
    # the input's tap is the last function of the walk.
    assert log[:2] == ['/l2/W', '/l2/b'] or log[:2] == ['/l2/b', '/l2/W']
    assert log.index('below l2') == 2
    assert sorted(log[3:5]) == ['/l1/W', '/l1/b'] and log[5] == 'input'
    assert reports == [['/unused']]  # no gradient: reported, not fired


def test_a_shared_parameter_fires_once_after_its_last_use_with_the_sum():
    W = Parameter(numpy.array([[2.0, -1.0]]))
    seen = []
    W.register_grad_hook(lambda p: seen.append(p.grad.copy()))
    x = Variable(numpy.array([[1.0], [3.0]]))
    h = F.tanh(F.matmul(x, W))
    loss = F.sum(F.matmul(h, W.T) * 2.0)
    loss.backward()
    assert len(seen) == 1
    numpy.testing.assert_array_equal(seen[0], W.grad)


def test_a_parameter_used_twice_by_one_function_counts_one_use():
    w = Parameter(numpy.array([3.0]))
    seen = []
    w.register_grad_hook(lambda p: seen.append(float(p.grad[0])))
    F.sum(w * w).backward()
    assert seen == [6.0]


def test_retain_graph_and_double_backprop_fire_once_per_backward():
    w = Parameter(numpy.array([1.5, -0.5]))
    count = []
    w.register_grad_hook(lambda p: count.append(1))
    y = F.sum(w ** 3)
    y.backward(retain_graph=True)
    assert len(count) == 1
    w.cleargrad()
    y.backward(enable_double_backprop=True)
    assert len(count) == 2
    g = w.grad_var              # 3 w^2, with a graph
    w.cleargrad()
    F.sum(g * g).backward()     # d/dw sum(9 w^4) = 36 w^3
    assert len(count) == 3
    numpy.testing.assert_allclose(w.grad, 36 * w.array ** 3)


def test_reached_without_gradient_is_reported_not_fired():
    net = minichain.Link()
    with net.init_scope():
        net.p = Parameter(numpy.array([1.0, 2.0]))
    log, reports = [], []
    net.register_grad_hook(lambda p: log.append(p), lambda m: reports.append(
        [n for n, _ in m]))
    q = Parameter(numpy.array([1.0, 1.0]))
    loss = F.sum(_Drop().apply((net.p,))[0] + q)
    loss.backward()
    assert log == [] and reports == [['/p']]


def test_a_use_the_walk_never_reaches_leaves_the_gradient_final_at_the_end():
    # p feeds a branch that gets no gradient (_Drop upstream of it) and a
    # branch that does: the first use is never visited, so p fires at the
    # end of the walk, with the gradient of the second branch.
    p = Parameter(numpy.array([2.0]))
    seen = []
    p.register_grad_hook(lambda v: seen.append(float(v.grad[0])))
    dead = _Drop().apply((F.exp(p),))[0]
    loss = F.sum(dead + p * 3.0)
    loss.backward()
    assert seen == [3.0]


def test_accumulated_gradients_fire_with_the_total_and_only_if_added_to():
    w = Parameter(numpy.array([1.0]))
    seen = []
    w.register_grad_hook(lambda p: seen.append(float(p.grad[0])))
    F.sum(w * 2.0).backward()
    F.sum(w * 5.0).backward()   # no cleargrad: accumulates
    assert seen == [2.0, 7.0]
    other = Parameter(numpy.array([1.0]))
    F.sum(other * 1.0).backward()  # does not touch w
    assert seen == [2.0, 7.0]


def test_remove_unregisters_and_copies_carry_no_hooks():
    w = Parameter(numpy.array([1.0]))
    seen = []
    handle = w.register_grad_hook(lambda p: seen.append(1))
    assert copy.deepcopy(w)._grad_hooks == ()
    F.sum(w * 1.0).backward()
    handle.remove()
    handle.remove()
    F.sum(w * 1.0).backward()
    assert seen == [1]
    from minichain import _grad_ready
    assert w not in _grad_ready._hooked


def test_a_hook_that_raises_stops_backward_with_its_error():
    w = Parameter(numpy.array([1.0]))

    def fail(p):
        raise RuntimeError('hook failed')
    w.register_grad_hook(fail)
    with pytest.raises(RuntimeError, match='hook failed'):
        F.sum(w * 1.0).backward()


def test_between_runs_after_each_function_while_a_gradient_is_pending():
    net, log = _Net(), []
    names = {id(p): n for n, p in net.namedparams()}
    handle = net.register_grad_hook(lambda p: log.append(names[id(p)]),
                                    between=lambda: log.append('|'))
    x = Variable(numpy.ones((1, 3), numpy.float32))
    net(x, log).backward()
    # sum, pow, l2's linear (its W and b final), the tap, tanh, l1's
    # linear: a '|' after each, once its hooks have fired
    assert log == ['|', '|', '/l2/W', '/l2/b', '|', 'below l2', '|', '|',
                   '/l1/W', '/l1/b', '|'], log
    handle.remove()
    del log[:]
    net.cleargrads()
    net(x, log).backward()
    assert log == ['below l2']
