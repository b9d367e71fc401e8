import gzip
import os
import struct

import numpy
import pytest

from minichain.datasets import fashion_mnist, get_fashion_mnist, read_idx

_TYPE = {numpy.dtype('uint8'): 0x08, numpy.dtype('int8'): 0x09, numpy.dtype('int32'): 0x0C,
         numpy.dtype('float32'): 0x0D}


def write_idx(path, array, gz=False):
    array = numpy.asarray(array)
    header = struct.pack('>BBBB', 0, 0, _TYPE[array.dtype], array.ndim)
    header += struct.pack('>{}I'.format(array.ndim), *array.shape)
    raw = header + array.astype(array.dtype.newbyteorder('>')).tobytes()
    if gz:
        raw, path = gzip.compress(raw), path + '.gz'
    with open(path, 'wb') as f:
        f.write(raw)
    return path


def make_set(folder, gz, n_train=6, n_test=4, seed=0):
    os.makedirs(folder, exist_ok=True)
    rng = numpy.random.default_rng(seed)
    arrays = {}
    for split, n in (('train', n_train), ('t10k', n_test)):
        images = rng.integers(0, 256, (n, 28, 28)).astype(numpy.uint8)
        labels = rng.integers(0, 10, n).astype(numpy.uint8)
        write_idx(os.path.join(folder, split + '-images-idx3-ubyte'),
                  images, gz)
        write_idx(os.path.join(folder, split + '-labels-idx1-ubyte'),
                  labels, gz)
        arrays[split] = images, labels
    return arrays


@pytest.fixture
def no_default_dirs(monkeypatch, tmp_path):
    monkeypatch.delenv(fashion_mnist.ENV_VAR, raising=False)
    monkeypatch.setattr(fashion_mnist, 'DEBIAN_DIR',
                        str(tmp_path / 'no-debian-dir'))


@pytest.mark.parametrize('gz', [False, True])
def test_load_from_data_dir(tmp_path, gz):
    arrays = make_set(str(tmp_path), gz)
    train, test = get_fashion_mnist(data_dir=tmp_path)
    assert len(train) == 6 and len(test) == 4
    x, t = train[1]
    assert x.shape == (784,) and x.dtype == numpy.float32
    assert t.dtype == numpy.int32
    images, labels = arrays['train']
    numpy.testing.assert_allclose(x, images[1].ravel() / 255.0, rtol=1e-6)
    assert t == labels[1]
    x, t = test[3]
    numpy.testing.assert_allclose(x, arrays['t10k'][0][3].ravel() / 255.0,
                                  rtol=1e-6)


def test_shapes_scale_dtypes_and_withlabel(tmp_path):
    make_set(str(tmp_path), gz=True)
    train, _ = get_fashion_mnist(ndim=3, scale=2.0, dtype=numpy.float64,
                                 label_dtype=numpy.int64, data_dir=tmp_path)
    x, t = train[0]
    assert x.shape == (1, 28, 28) and x.dtype == numpy.float64
    assert t.dtype == numpy.int64
    assert 0 <= x.min() and x.max() <= 2.0
    train, test = get_fashion_mnist(withlabel=False, ndim=2,
                                    data_dir=tmp_path)
    assert isinstance(train, numpy.ndarray) and train.shape == (6, 28, 28)
    assert test.shape == (4, 28, 28)
    with pytest.raises(ValueError, match='ndim must be 1, 2 or 3'):
        get_fashion_mnist(ndim=4, data_dir=tmp_path)


def test_env_var_root_and_its_subfolder(tmp_path, monkeypatch,
                                        no_default_dirs):
    make_set(str(tmp_path / 'fashion-mnist'), gz=True, n_train=3)
    make_set(str(tmp_path), gz=False, n_train=5)  # e.g. MNIST at the root
    monkeypatch.setenv('MINICHAIN_DATASET_ROOT', str(tmp_path))
    train, _ = get_fashion_mnist()
    assert len(train) == 3  # the subfolder wins
    other = tmp_path / 'only-root'
    make_set(str(other), gz=False, n_train=2)
    monkeypatch.setenv('MINICHAIN_DATASET_ROOT', str(other))
    assert len(get_fashion_mnist()[0]) == 2


def test_debian_dir_is_searched(tmp_path, monkeypatch, no_default_dirs):
    make_set(str(tmp_path / 'deb'), gz=True, n_train=2)
    monkeypatch.setattr(fashion_mnist, 'DEBIAN_DIR', str(tmp_path / 'deb'))
    assert len(get_fashion_mnist()[0]) == 2


def test_missing_files_error_says_where_and_how(tmp_path, monkeypatch,
                                                no_default_dirs):
    monkeypatch.setenv('MINICHAIN_DATASET_ROOT', str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        get_fashion_mnist()
    message = str(info.value)
    assert str(tmp_path / 'fashion-mnist') in message
    assert fashion_mnist.DEBIAN_DIR in message
    assert 'apt-get install dataset-fashion-mnist' in message
    assert 'MINICHAIN_DATASET_ROOT' in message
    assert 'train-images-idx3-ubyte' in message


def test_partial_set_names_the_missing_file(tmp_path):
    make_set(str(tmp_path), gz=True)
    os.remove(str(tmp_path / 't10k-labels-idx1-ubyte.gz'))
    with pytest.raises(FileNotFoundError,
                       match='missing t10k-labels-idx1-ubyte'):
        get_fashion_mnist(data_dir=tmp_path)


def test_corrupt_files_raise_value_error_naming_the_file(tmp_path):
    make_set(str(tmp_path), gz=False)
    path = str(tmp_path / 'train-images-idx3-ubyte')
    raw = open(path, 'rb').read()
    with open(path, 'wb') as f:
        f.write(raw[:-5])  # truncated data
    with pytest.raises(ValueError, match='train-images-idx3-ubyte holds'):
        get_fashion_mnist(data_dir=tmp_path)
    with open(path, 'wb') as f:
        f.write(b'\x00\x00\x42\x03' + raw[4:])  # unknown type byte
    with pytest.raises(ValueError, match='train-images.*not an IDX file'):
        get_fashion_mnist(data_dir=tmp_path)
    with open(path, 'wb') as f:
        f.write(raw[:6])  # ends inside the header
    with pytest.raises(ValueError, match='ends inside its header'):
        read_idx(path)


def test_bad_gzip_and_mismatched_counts(tmp_path):
    make_set(str(tmp_path), gz=True)
    labels = str(tmp_path / 'train-labels-idx1-ubyte.gz')
    with open(labels, 'wb') as f:
        f.write(b'\x1f\x8b' + b'garbage' * 5)
    with pytest.raises(ValueError, match='train-labels.*not a valid gzip'):
        get_fashion_mnist(data_dir=tmp_path)
    write_idx(labels[:-3], numpy.zeros(5, numpy.uint8), gz=True)
    with pytest.raises(ValueError, match='has 6 images but .* has 5 labels'):
        get_fashion_mnist(data_dir=tmp_path)
    write_idx(labels[:-3], numpy.zeros((6, 2), numpy.uint8), gz=True)
    with pytest.raises(ValueError, match=r'labels of shape \(N,\)'):
        get_fashion_mnist(data_dir=tmp_path)


@pytest.mark.parametrize('dtype', [numpy.uint8, numpy.int32, numpy.float32])
def test_read_idx_types(tmp_path, dtype):
    a = (numpy.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    if dtype == numpy.uint8:
        a = numpy.arange(24, dtype=dtype).reshape(2, 3, 4)
    path = write_idx(str(tmp_path / 'a'), a)
    out = read_idx(path)
    assert out.dtype == dtype and out.dtype.isnative
    numpy.testing.assert_array_equal(out, a)


def test_labels_outside_the_classes_are_refused_at_load(tmp_path):
    folder = str(tmp_path / 'set')
    make_set(folder, gz=False)
    labels = numpy.array([0, 1, 200, 3, 4, 5], numpy.uint8)
    write_idx(os.path.join(folder, 'train-labels-idx1-ubyte'), labels)
    with pytest.raises(ValueError, match=r'train-labels-idx1-ubyte holds '
                       r'label 200 at index 2 .*0 to 9'):
        get_fashion_mnist(data_dir=folder)
    signed = numpy.array([0, 1, 2, -1, 4, 5], numpy.int8)  # not an ignore
    write_idx(os.path.join(folder, 'train-labels-idx1-ubyte'), signed)
    with pytest.raises(ValueError, match='label -1 at index 3'):
        get_fashion_mnist(data_dir=folder)
