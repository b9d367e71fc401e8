"""get_mnist: Chainer's arguments, over local IDX files."""
import numpy
import pytest

import minichain
from minichain.datasets import get_mnist
from tests.datasets.test_fashion_mnist import make_set, write_idx


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv('MINICHAIN_DATASET_ROOT', str(tmp_path))
    return tmp_path


def test_reads_the_mnist_subfolder_of_the_dataset_root(root):
    arrays = make_set(str(root / 'mnist'), gz=True)
    train, test = get_mnist()
    assert len(train) == 6 and len(test) == 4
    x, t = train[2]
    assert x.shape == (784,) and x.dtype == numpy.float32
    assert t.dtype == numpy.int32
    images, labels = arrays['train']
    numpy.testing.assert_allclose(x, images[2].ravel() / 255.0, rtol=1e-6)
    assert t == labels[2]


def test_not_the_root_itself_which_may_hold_fashion_mnist(root):
    make_set(str(root), gz=False)  # same file names as MNIST's
    with pytest.raises(FileNotFoundError) as info:
        get_mnist()
    message = str(info.value)
    assert message.startswith('get_mnist: the MNIST IDX files')
    assert str(root / 'mnist') + ': no MNIST files' in message
    assert 'Put the four files in ' + str(root / 'mnist') in message


def test_missing_files_without_a_root_say_where_to_put_them(monkeypatch):
    monkeypatch.delenv('MINICHAIN_DATASET_ROOT', raising=False)
    with pytest.raises(FileNotFoundError) as info:
        get_mnist()
    message = str(info.value)
    assert 'train-images-idx3-ubyte' in message
    assert '$MINICHAIN_DATASET_ROOT/mnist' in message
    assert 'MINICHAIN_DATASET_ROOT is not set' in message
    assert 'data_dir=' in message


def test_data_dir_wins_and_chainers_arguments(root, tmp_path):
    make_set(str(root / 'mnist'), gz=True, n_train=3)
    other = tmp_path / 'elsewhere'
    make_set(str(other), gz=False, n_train=5)
    assert len(get_mnist(data_dir=other)[0]) == 5
    train, _ = get_mnist(ndim=3, scale=2.0, dtype=numpy.float64,
                         label_dtype=numpy.int64, rgb_format=True)
    x, t = train[0]
    assert x.shape == (3, 28, 28) and x.dtype == numpy.float64
    numpy.testing.assert_array_equal(x[0], x[2])
    assert 0 <= x.min() and x.max() <= 2.0 and t.dtype == numpy.int64
    images, _ = get_mnist(withlabel=False, ndim=2)
    assert isinstance(images, numpy.ndarray) and images.shape == (3, 28, 28)
    with pytest.raises(ValueError, match='get_mnist: rgb_format=True .* '
                       'needs ndim=3'):
        get_mnist(rgb_format=True)
    with pytest.raises(ValueError, match='get_mnist: ndim must be 1, 2 or 3'):
        get_mnist(ndim=0)


def test_dtype_none_follows_config_dtype(root):
    make_set(str(root / 'mnist'), gz=True)
    with minichain.using_config('dtype', 'float64'):
        train, _ = get_mnist()
    assert train[0][0].dtype == numpy.float64


def test_corrupt_file_is_named(root):
    make_set(str(root / 'mnist'), gz=False)
    path = root / 'mnist' / 't10k-labels-idx1-ubyte'
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match='t10k-labels-idx1-ubyte holds'):
        get_mnist()


def test_labels_outside_the_digits_are_refused(root):
    make_set(str(root / 'mnist'), gz=False)
    write_idx(str(root / 'mnist' / 't10k-labels-idx1-ubyte'),
              numpy.array([0, 1, 2, 10], numpy.uint8))
    with pytest.raises(ValueError, match=r'get_mnist: .*t10k-labels-idx1-'
                       r'ubyte holds label 10 at index 3 \(1 labels out of '
                       r'range\); MNIST labels are 0 to 9'):
        get_mnist()


@pytest.mark.parametrize('value, shown', [
    (0.5, '0.5'), (9.99, '9.99'), (-0.7, '-0.7'), (numpy.nan, 'nan'),
    (numpy.inf, 'inf')])
def test_float_labels_must_be_whole_numbers(root, value, shown):
    # astype(int32) would truncate 9.99 to 9 and -0.7 to 0 and turn NaN
    # into -2**31: the run trained on wrong classes without a word.
    make_set(str(root / 'mnist'), gz=False)
    labels = numpy.array([0, 1, value, 3], numpy.float32)
    write_idx(str(root / 'mnist' / 't10k-labels-idx1-ubyte'), labels)
    with pytest.raises(ValueError, match=r'get_mnist: .*t10k-labels-idx1-'
                       r'ubyte holds label {}.* at index 2 \(1 labels not '
                       r'whole numbers\)'.format(shown)):
        get_mnist()


def test_whole_float_labels_are_read(root):
    make_set(str(root / 'mnist'), gz=False)
    write_idx(str(root / 'mnist' / 't10k-labels-idx1-ubyte'),
              numpy.array([0, 1, 9, 3], numpy.float32))
    _, test = get_mnist()
    assert [int(t) for _, t in test] == [0, 1, 9, 3]
    write_idx(str(root / 'mnist' / 't10k-labels-idx1-ubyte'),
              numpy.array([0, 1, 12, 3], numpy.float32))
    with pytest.raises(ValueError, match='holds label 12.0 at index 2 '
                       r'\(1 labels out of range\)'):
        get_mnist()
