"""Variable and Parameter: attributes, operators, gradients, repr, lazy init."""
import operator

import numpy
import pytest

import minichain
import minichain.functions as F
from minichain import Parameter, Variable, backend


def make(shape=(2, 3), dtype=numpy.float32, name=None):
    data = numpy.arange(1, numpy.prod(shape) + 1, dtype=dtype).reshape(shape)
    return Variable(data, name=name)


def test_array_attributes():
    v = make()
    assert v.data is v.array
    v.data = numpy.zeros((4,), numpy.float32)
    assert v.array.shape == (4,)
    v = make()
    assert (v.shape, v.ndim, v.size, v.dtype) == ((2, 3), 2, 6, numpy.float32)
    assert len(v) == 2
    assert v.xp is numpy
    assert v.creator is None and v.generation == 0
    assert v.grad is None and v.grad_var is None


def test_shape_methods_are_differentiable():
    v = make()
    for y, shape in ((v.T, (3, 2)), (v.transpose(), (3, 2)),
                     (v.transpose(1, 0), (3, 2)), (v.reshape(3, 2), (3, 2)),
                     (v.reshape((6,)), (6,))):
        assert isinstance(y, Variable) and y.shape == shape
        assert y.creator is not None
    F.sum(v.T * v.T.array).backward()
    numpy.testing.assert_array_equal(v.grad, v.array)


def test_data_must_be_an_array():
    with pytest.raises(TypeError, match='Variable: data must be'):
        Variable([1.0, 2.0])
    v = Variable(numpy.float32(2.0))  # a NumPy scalar becomes a 0-d array
    assert isinstance(v.array, numpy.ndarray) and v.shape == ()


OPS = [operator.add, operator.sub, operator.mul, operator.truediv,
       operator.pow]
OTHERS = [2, 2.5, numpy.float64(2.5), numpy.float32(2.5), numpy.int64(2),
          numpy.array([1.5, 2.0, 2.5]), numpy.array([1.5, 2.0, 2.5],
                                                     numpy.float32)]


@pytest.mark.parametrize('op', OPS, ids=lambda o: o.__name__)
@pytest.mark.parametrize('other', OTHERS, ids=repr)
@pytest.mark.parametrize('variable_first', [True, False])
def test_operators_with_scalars_and_arrays_on_either_side(op, other,
                                                          variable_first):
    x = numpy.array([1.0, 2.0, 3.0], numpy.float32)
    v = Variable(x.copy())
    y = op(v, other) if variable_first else op(other, v)
    assert isinstance(y, Variable)
    assert y.dtype == numpy.float32  # constants take the variable's dtype
    o = numpy.asarray(other).astype(numpy.float32)
    expected = op(x, o) if variable_first else op(o, x)
    numpy.testing.assert_allclose(y.array, expected, rtol=1e-6)


def test_reflected_operators_differentiate_the_variable():
    x = numpy.array([1.0, 2.0, 3.0])
    c = numpy.array([4.0, 5.0, 6.0])
    v = Variable(x.copy())
    F.sum(c * v - c / v + numpy.float64(2) ** v).backward()
    numpy.testing.assert_allclose(
        v.grad, c + c / x ** 2 + 2 ** x * numpy.log(2), rtol=1e-12)


def test_unary_matmul_and_indexing():
    a = make((2, 3), numpy.float64)
    b = numpy.ones((3, 2))
    assert isinstance(b.T @ a.T, Variable)
    numpy.testing.assert_array_equal((a @ b).array, a.array @ b)
    numpy.testing.assert_array_equal((b.T @ a.T).array, b.T @ a.array.T)
    numpy.testing.assert_array_equal((-a).array, -a.array)
    assert (+a) is a
    numpy.testing.assert_array_equal(a[1, 1:].array, a.array[1, 1:])
    F.sum(a[:, 0]).backward()
    numpy.testing.assert_array_equal(a.grad, [[1, 0, 0], [1, 0, 0]])


def test_numpy_ufuncs_are_refused_not_silently_unwrapped():
    with pytest.raises(TypeError):
        numpy.exp(make())


def test_repr_shows_values_shape_dtype_and_name():
    r = repr(make(name='h'))
    assert r.startswith('variable([[1., 2., 3.]')
    assert 'shape=(2, 3)' in r and 'dtype=float32' in r and "name='h'" in r
    assert 'name' not in repr(make())
    assert str(make(name='h')) == r
    assert repr(Parameter(numpy.zeros(2), name='W')).startswith('parameter(')
    assert repr(Parameter(name='W')) == "parameter(uninitialized, name='W')"


def test_grad_setter_checks_shape_dtype_and_device():
    v = make(name='h')
    v.grad = numpy.ones((2, 3), numpy.float32)
    assert isinstance(v.grad_var, Variable) and not v.grad_var.requires_grad
    with pytest.raises(ValueError, match=r"'h'.*\(3, 2\).*\(2, 3\)"):
        v.grad = numpy.ones((3, 2), numpy.float32)
    with pytest.raises(TypeError, match='float64.*float32'):
        v.grad = numpy.ones((2, 3))
    with pytest.raises(ValueError):
        v.grad_var = Variable(numpy.ones(3, numpy.float32))
    v.grad = None
    assert v.grad is None


def test_cleargrad_and_zerograd():
    v = make()
    v.zerograd()
    numpy.testing.assert_array_equal(v.grad, numpy.zeros((2, 3)))
    assert v.grad.dtype == numpy.float32
    F.sum(v).backward()
    numpy.testing.assert_array_equal(v.grad, numpy.ones((2, 3)))
    v.cleargrad()
    assert v.grad is None


def test_backward_on_a_leaf_does_nothing():
    v = make()
    v.backward()
    assert v.grad is None


def test_backward_needs_one_element_or_none_without_a_gradient():
    x = make()
    with pytest.raises(ValueError, match=r'shape \(2, 3\); backward without '
                       'a gradient needs a single element'):
        (x * 2).backward()
    # An empty variable (minichain.dist.functions' delegate variable) seeds
    # its empty gradient: the walk reaches the function that made it.
    empty = F.get_item(x * 2, (slice(0, 0),))
    assert empty.shape == (0, 3)
    empty.backward()
    numpy.testing.assert_array_equal(x.grad, numpy.zeros((2, 3)))


def test_unchain_backward_cuts_every_link_upstream():
    x = make()
    h = x * 2
    g = h + 1
    y = F.sum(g)
    g.unchain_backward()
    assert g.creator is None and h.creator is None
    assert y.creator is not None
    y.backward()
    assert x.grad is None  # the graph above g is gone
    numpy.testing.assert_array_equal(g.grad, numpy.ones((2, 3)))


def test_unchain_cuts_one_link():
    x = make()
    h = x * 2
    h.unchain()
    F.sum(h * 3).backward()
    assert x.grad is None and h.grad is not None


def test_to_cpu_is_a_no_op_on_the_host():
    v = make()
    a = v.array
    assert v.to_cpu() is v and v.array is a


@pytest.mark.skipif(backend.gpu_available(), reason='a GPU is present')
def test_to_gpu_without_gpu_raises_clearly():
    with pytest.raises(RuntimeError, match='CuPy|CUDA'):
        make().to_gpu()


# -- Parameter --------------------------------------------------------------
def test_parameter_lazy_initialization():
    p = Parameter(2.0, name='W')
    assert not p.is_initialized and p.array is None
    assert p.update_rule is None
    with pytest.raises(AttributeError, match="'W' is not initialized"):
        p.shape
    p.zerograd()  # deferred until the data exists
    p.initialize((2, 3))
    assert p.is_initialized
    numpy.testing.assert_array_equal(p.array, numpy.full((2, 3), 2.0))
    assert p.dtype == numpy.dtype(minichain.config.dtype)
    numpy.testing.assert_array_equal(p.grad, numpy.zeros((2, 3)))
    assert p.requires_grad


def test_parameter_with_shape_or_array_is_initialized_at_once():
    p = Parameter(0.5, (3,))
    numpy.testing.assert_array_equal(p.array, [0.5, 0.5, 0.5])
    a = numpy.arange(4.0)
    q = Parameter(a)
    assert q.array is a and q.is_initialized
    r = Parameter(None, (2,))  # no initializer: NaN, so misuse shows
    assert numpy.isnan(r.array).all()


def test_parameter_is_a_differentiable_leaf():
    p = Parameter(numpy.array([1.0, 2.0]))
    F.sum(p * p).backward()
    numpy.testing.assert_array_equal(p.grad, [2.0, 4.0])


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_variable_and_parameter_gpu_round_trip():
    import cupy
    v = make(dtype=numpy.float64)
    v.grad = numpy.ones((2, 3))
    v.to_gpu()
    assert isinstance(v.array, cupy.ndarray) and v.xp is cupy
    assert isinstance(v.grad, cupy.ndarray)
    v.cleargrad()
    F.sum(v * v).backward()
    numpy.testing.assert_allclose(backend.to_cpu(v.grad),
                                  2 * backend.to_cpu(v.array))
    v.to_cpu()
    assert isinstance(v.array, numpy.ndarray)
    assert isinstance(v.grad, numpy.ndarray)
    p = Parameter(1.0)
    p.to_gpu()
    p.initialize((2,))  # lazy data goes where the parameter lives
    assert isinstance(p.array, cupy.ndarray)
    assert 'shape=(2,)' in repr(p)


@pytest.mark.parametrize('dtype', [numpy.int32, numpy.bool_])
def test_backward_from_an_integer_variable_says_integers_have_no_gradient(
        dtype):
    # It used to fail inside Sum.backward on 'int64 vs int32'.
    v = Variable(numpy.array([1, 0, 1], dtype), name='v')
    y = F.sum(v * 1)
    with pytest.raises(TypeError, match='Variable.backward: variable .* has '
                       'dtype int64: integers and booleans cannot be '
                       'differentiated'):
        y.backward()
