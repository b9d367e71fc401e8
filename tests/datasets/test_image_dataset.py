import os
import sys
import warnings

import numpy
import pytest

from minichain.dataset import concat_examples, drop_none
from minichain.datasets import ImageFolderDataset, LabeledImageDataset

Image = pytest.importorskip('PIL.Image')


def _save(path, array, mode):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array, mode=mode).save(path)


@pytest.fixture
def tree(tmp_path):
    """root/cat: 2 RGB images; root/dog: 1 gray image, 1 corrupt png and a
    text file; root/empty: nothing; root/.hidden: ignored."""
    root = tmp_path / 'root'
    rgb = numpy.arange(4 * 5 * 3, dtype=numpy.uint8).reshape(4, 5, 3)
    _save(str(root / 'cat' / 'a.png'), rgb, 'RGB')
    _save(str(root / 'cat' / 'B.PNG'), rgb[::-1].copy(), 'RGB')
    gray = numpy.full((4, 5), 200, dtype=numpy.uint8)
    _save(str(root / 'dog' / 'c.png'), gray, 'L')
    (root / 'dog' / 'bad.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'x' * 40)
    (root / 'dog' / 'notes.txt').write_text('not an image')
    (root / 'empty').mkdir()
    (root / '.hidden').mkdir()
    return root, rgb, gray


def test_image_folder_layout(tree):
    root, rgb, gray = tree
    with pytest.warns(UserWarning, match='empty has no images; label 2'):
        ds = ImageFolderDataset(root)
    assert ds.classes == ['cat', 'dog', 'empty']
    assert ds.class_to_index == {'cat': 0, 'dog': 1, 'empty': 2}
    assert [p for p, _ in ds.pairs] == [
        os.path.join('cat', 'B.PNG'), os.path.join('cat', 'a.png'),
        os.path.join('dog', 'bad.png'), os.path.join('dog', 'c.png')]
    image, label = ds[1]
    assert image.shape == (3, 4, 5) and image.dtype == numpy.float32
    numpy.testing.assert_array_equal(image, rgb.transpose(2, 0, 1))
    assert label.dtype == numpy.int32 and label == 0
    image, label = ds[3]  # gray converted to RGB
    assert image.shape == (3, 4, 5) and (image == 200).all() and label == 1


def test_corrupt_image_raises_by_default(tree):
    root, _, _ = tree
    with pytest.warns(UserWarning):
        ds = ImageFolderDataset(root)
    with pytest.raises(ValueError, match='cannot decode image .*bad.png'):
        ds[2]


def test_corrupt_image_skipped_and_counted(tree):
    root, _, _ = tree
    with pytest.warns(UserWarning):
        ds = ImageFolderDataset(root, on_error='skip')
    with pytest.warns(UserWarning, match='bad.png.*skipped'):
        assert ds[2] is None
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # warned once per file
        assert ds[2] is None
    assert ds.n_skipped == 1 and ds.skipped[0].endswith('bad.png')
    x, t = drop_none(concat_examples)(ds[0:4])
    assert x.shape == (3, 3, 4, 5)
    numpy.testing.assert_array_equal(t, [0, 0, 1])


def test_labeled_image_dataset_pairs_and_list_file(tree, tmp_path):
    root, rgb, gray = tree
    ds = LabeledImageDataset([('cat/a.png', 4), ('dog/c.png', 7)], root=root,
                             dtype=numpy.uint8, label_dtype=numpy.int64)
    image, label = ds[0]
    assert image.shape == (3, 4, 5) and image.dtype == numpy.uint8
    assert label.dtype == numpy.int64 and label == 4
    image, _ = ds[1]
    assert image.shape == (1, 4, 5)  # no mode: gray keeps one channel
    listing = tmp_path / 'list.txt'
    listing.write_text('cat/a.png 3\n\ndog/c.png   1\n')
    ds = LabeledImageDataset(str(listing), root=str(root), mode='L')
    assert len(ds) == 2 and ds[0][0].shape == (1, 4, 5)
    assert ds[1][1] == 1


def test_list_file_errors(tmp_path):
    listing = tmp_path / 'list.txt'
    listing.write_text('a.png 1\nb.png x\n')
    with pytest.raises(ValueError, match='line 2 of .*list.txt'):
        LabeledImageDataset(str(listing))
    with pytest.raises(ValueError, match="on_error must be 'raise' or"):
        LabeledImageDataset([], on_error='ignore')
    with pytest.raises(FileNotFoundError):
        LabeledImageDataset([('missing.png', 0)], root=str(tmp_path))[0]


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match='is not a folder'):
        ImageFolderDataset(tmp_path / 'nope')
    with pytest.raises(ValueError, match='no class sub-folders'):
        ImageFolderDataset(tmp_path)
    (tmp_path / 'a').mkdir()
    with pytest.warns(UserWarning), pytest.raises(ValueError,
                                                  match='no images'):
        ImageFolderDataset(tmp_path)


def test_missing_pillow_gives_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, 'PIL', None)
    with pytest.raises(ImportError, match='pip install Pillow'):
        LabeledImageDataset([])


def _bomb(path, side=40000):
    """A PNG header claiming side x side pixels (Pillow refuses it before
    decoding: more than twice MAX_IMAGE_PIXELS) in a few bytes."""
    import struct
    import zlib

    def chunk(kind, data):
        return (struct.pack('>I', len(data)) + kind + data
                + struct.pack('>I', zlib.crc32(kind + data)))
    ihdr = struct.pack('>IIBBBBB', side, side, 8, 0, 0, 0, 0)
    path.write_bytes(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr)
                     + chunk(b'IDAT', zlib.compress(b'\0' * 64))
                     + chunk(b'IEND', b''))


def test_decompression_bomb_is_unreadable(tmp_path):
    _bomb(tmp_path / 'bomb.png')
    gray = numpy.zeros((4, 4), numpy.uint8)
    _save(str(tmp_path / 'ok.png'), gray, 'L')
    pairs = [('bomb.png', 0), ('ok.png', 1)]
    with pytest.raises(ValueError, match='cannot decode image .*bomb.png'):
        LabeledImageDataset(pairs, root=str(tmp_path))[0]
    ds = LabeledImageDataset(pairs, root=str(tmp_path), on_error='skip')
    with pytest.warns(UserWarning, match='bomb.png.*skipped'):
        assert ds[0] is None
    assert ds[1][0].shape == (1, 4, 4) and ds.n_skipped == 1


def test_negative_labels_are_refused_unless_ignored(tmp_path):
    listing = tmp_path / 'list.txt'
    listing.write_text('a.png 0\nb.png -1\n')
    with pytest.raises(ValueError, match=r'b.png in .*list.txt has the '
                       r'negative label -1.*ignore_label=-1'):
        LabeledImageDataset(str(listing), root=str(tmp_path))
    ds = LabeledImageDataset(str(listing), root=str(tmp_path),
                             ignore_label=-1)
    assert [t for _, t in ds.pairs] == [0, -1]
