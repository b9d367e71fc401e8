import numpy
import pytest

from minichain import backend
from minichain.dataset import concat_examples, drop_none, to_device

gpu = pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')


def _tuples():
    return [(numpy.full(3, i, numpy.float32), numpy.int32(i))
            for i in range(4)]


def test_tuples_become_tuple_of_stacked_arrays():
    x, t = concat_examples(_tuples())
    assert x.shape == (4, 3) and x.dtype == numpy.float32
    numpy.testing.assert_array_equal(x[:, 0], [0, 1, 2, 3])
    assert t.dtype == numpy.int32
    numpy.testing.assert_array_equal(t, [0, 1, 2, 3])


def test_python_int_labels():
    _, t = concat_examples([(numpy.zeros(2), 1), (numpy.zeros(2), 2)])
    numpy.testing.assert_array_equal(t, [1, 2])


def test_dicts():
    batch = [{'x': numpy.ones((2, 2)), 'y': numpy.float64(i)}
             for i in range(3)]
    out = concat_examples(batch)
    assert set(out) == {'x', 'y'}
    assert out['x'].shape == (3, 2, 2)
    numpy.testing.assert_array_equal(out['y'], [0, 1, 2])


def test_plain_arrays():
    out = concat_examples([numpy.arange(2), numpy.arange(2) + 5])
    numpy.testing.assert_array_equal(out, [[0, 1], [5, 6]])


def test_padding_pads_to_the_largest_shape():
    batch = [(numpy.ones(2, numpy.int32), numpy.ones((1, 3))),
             (numpy.ones(4, numpy.int32), numpy.ones((2, 1)))]
    x, y = concat_examples(batch, padding=-1)
    numpy.testing.assert_array_equal(x, [[1, 1, -1, -1], [1, 1, 1, 1]])
    assert y.shape == (2, 2, 3)
    numpy.testing.assert_array_equal(y[1], [[1, -1, -1], [1, -1, -1]])
    x, y = concat_examples(batch, padding=(0, 9))
    assert x[0, 3] == 0 and y[0, 1, 0] == 9


def test_errors():
    with pytest.raises(ValueError, match='empty'):
        concat_examples([])
    with pytest.raises(ValueError,
                       match=r'different shapes \[\(2,\), \(3,\)\]'):
        concat_examples([numpy.zeros(2), numpy.zeros(3)])
    with pytest.raises(ValueError, match='example 1 of the batch is None'):
        concat_examples([(numpy.zeros(2), 1), None])
    with pytest.raises(TypeError, match='arrays, scalars, tuples or dicts'):
        concat_examples(['a', 'b'])
    # an empty first tuple does not hide longer ones (it returned ())
    with pytest.raises(ValueError, match='tuples of different lengths'):
        concat_examples([(), (numpy.zeros(2),)])


def test_device_cpu_and_none():
    x = numpy.zeros((2, 3))
    assert to_device(None, x) is x
    out, = concat_examples([(numpy.zeros(2),)], device=-1)
    assert isinstance(out, numpy.ndarray)
    out, = concat_examples([(numpy.zeros(2),)], device='@numpy')
    assert isinstance(out, numpy.ndarray)


def test_drop_none():
    batch = [(numpy.zeros(2), 0), None, (numpy.ones(2), 1)]
    x, t = drop_none()(batch)
    assert x.shape == (2, 2)
    numpy.testing.assert_array_equal(t, [0, 1])
    with pytest.raises(ValueError, match='every example'):
        drop_none()([None, None])


@gpu
@pytest.mark.gpu
def test_device_gpu():
    cupy = backend.get_cupy()
    x, t = concat_examples(_tuples(), device='@cupy:0')
    assert isinstance(x, cupy.ndarray) and isinstance(t, cupy.ndarray)
    numpy.testing.assert_array_equal(cupy.asnumpy(t), [0, 1, 2, 3])
