import numpy
import pytest

import minichain.functions as F
from minichain import Variable
from minichain.gradient_check import check_backward, check_double_backward

TOL = {numpy.float64: (1e-5, 1e-6, 1e-5), numpy.float32: (1e-2, 5e-3, 1e-2)}
IDS = numpy.array([[0, 4, 2], [4, 4, 1]], numpy.int32)  # 4 repeats


def _w(dtype, seed=0):
    return numpy.random.default_rng(seed).standard_normal((5, 3)).astype(
        dtype)


@pytest.mark.parametrize('ignore_label', [None, 4, -1])
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_forward_picks_rows_and_zeros_the_ignored(ignore_label, dtype):
    x = IDS if ignore_label != -1 else numpy.where(IDS == 4, -1, IDS)
    W = _w(dtype)
    y = F.embed_id(x, Variable(W), ignore_label).array
    assert y.shape == (2, 3, 3) and y.dtype == dtype
    for index in numpy.ndindex(x.shape):
        want = (numpy.zeros(3) if x[index] == ignore_label
                else W[x[index]])
        numpy.testing.assert_array_equal(y[index], want)


@pytest.mark.parametrize('ignore_label', [None, 4])
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_backward_and_double_backward(ignore_label, dtype):
    eps, atol, rtol = TOL[dtype]
    rng = numpy.random.default_rng(1)
    gy = rng.standard_normal((2, 3, 3)).astype(dtype)
    ggW = rng.standard_normal((5, 3)).astype(dtype)

    def f(W):
        return F.embed_id(IDS, W, ignore_label)
    check_backward(f, (_w(dtype),), gy, eps=eps, atol=atol, rtol=rtol)
    # y ** 2 makes the second derivative flow through EmbedIDGrad
    check_double_backward(lambda W: f(W) ** 2, (_w(dtype),), gy, (ggW,),
                          eps=eps, atol=atol, rtol=rtol)


def test_the_gradient_sums_repeated_ids_and_skips_the_ignored():
    W = Variable(numpy.zeros((5, 2)))
    F.sum(F.embed_id(IDS, W, ignore_label=2)).backward()
    numpy.testing.assert_array_equal(W.grad[:, 0], [1, 1, 0, 0, 3])


def test_errors_name_the_function():
    with pytest.raises(TypeError, match='embed_id: x must hold integer ids'):
        F.embed_id(numpy.zeros(2), Variable(numpy.zeros((3, 2))))
    with pytest.raises(ValueError, match=r'embed_id: W must be 2-D'):
        F.embed_id(IDS, Variable(numpy.zeros(3)))


def test_an_id_out_of_range_is_an_error_not_another_row():
    W = Variable(numpy.zeros((5, 2)))
    for ids in ([-1, 0], [0, 5]):  # -1 would read the last row
        with pytest.raises(ValueError, match=r'embed_id: ids must lie in '
                           r'\[0, 5\) \(W of shape \(5, 2\)\), got'):
            F.embed_id(numpy.array(ids), W)
    # the ignored id may be anything
    F.embed_id(numpy.array([-1, 4]), W, ignore_label=-1)
