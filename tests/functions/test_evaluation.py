import numpy
import pytest

import minichain.functions as F
from minichain import Variable, backend


def _np_accuracy(y, t, ignore_label=None):
    pred = y.argmax(axis=1)
    keep = numpy.ones(t.shape, bool) if ignore_label is None else \
        t != ignore_label
    if keep.sum() == 0:
        return 0.0
    return (pred == t)[keep].mean()


def _data(shape, seed=0):
    rng = numpy.random.RandomState(seed)
    y = rng.randn(*shape)
    t = rng.randint(0, shape[1], shape[:1] + shape[2:]).astype(numpy.int32)
    return y, t


@pytest.mark.parametrize('shape', [(10, 4), (3, 5, 2, 3)])
@pytest.mark.parametrize('ignore_label', [None, -1])
@pytest.mark.parametrize('dtype', [numpy.float64, numpy.float32])
def test_accuracy_matches_numpy(shape, ignore_label, dtype):
    y, t = _data(shape)
    if ignore_label is not None:
        t.reshape(-1)[::3] = ignore_label
    acc = F.accuracy(Variable(y.astype(dtype)), t, ignore_label=ignore_label)
    assert isinstance(acc, Variable)
    assert acc.shape == () and acc.dtype == dtype
    numpy.testing.assert_allclose(acc.array,
                                  _np_accuracy(y, t, ignore_label), rtol=1e-6)


def test_accuracy_known_values():
    y = numpy.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    t = numpy.array([1, 1, 1, 0])
    assert float(F.accuracy(y, t).array) == 0.75
    t_ign = numpy.array([1, 5, 5, 0])  # the wrong prediction is ignored
    assert float(F.accuracy(y, t_ign, ignore_label=5).array) == 1.0
    assert float(F.accuracy(y, numpy.full(4, 5), ignore_label=5).array) == 0.0


def test_accuracy_records_no_graph():
    y = Variable(_data((4, 3))[0])
    acc = F.accuracy(y, _data((4, 3))[1])
    assert acc.creator is None
    acc.backward()  # a leaf: nothing to do, and no error
    assert y.grad is None


def test_accuracy_errors():
    y, t = _data((4, 3))
    with pytest.raises(ValueError, match=r'accuracy: y of shape \(4, 3\).*'
                                         r't of shape \(3,\)'):
        F.accuracy(y, t[:3])
    with pytest.raises(ValueError, match=r'accuracy: .*\(4, 3, 2\).*\(4,\)'):
        F.accuracy(numpy.zeros((4, 3, 2)), t)
    with pytest.raises(TypeError, match=r'accuracy: t .*float64'):
        F.accuracy(y, t.astype(numpy.float64))
    with pytest.raises(ValueError, match=r'accuracy: .*\(4,\)'):
        F.accuracy(y[:, 0], t)
    with pytest.raises(TypeError, match='accuracy: y'):
        F.accuracy(y.tolist(), t)


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_gpu_matches_cpu():
    y, t = _data((6, 3, 2))
    t[0] = -1
    for ignore_label in (None, -1):
        cpu = F.accuracy(y, t, ignore_label=ignore_label).array
        gpu = F.accuracy(backend.to_gpu(y), backend.to_gpu(t),
                         ignore_label=ignore_label).array
        numpy.testing.assert_allclose(backend.to_cpu(gpu), cpu)
