"""Image files as datasets: LabeledImageDataset and ImageFolderDataset.

Images are decoded with Pillow, imported only when a dataset is created
(``pip install Pillow``). An example is ``(image, label)`` with
the image as a ``(channels, height, width)`` array.
"""
import os
import warnings

import numpy

from minichain.dataset.dataset_mixin import DatasetMixin

__all__ = ['LabeledImageDataset', 'ImageFolderDataset']

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.ppm', '.pgm', '.gif',
                    '.tif', '.tiff', '.webp')


def _import_pil(where):
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError('{} needs Pillow to decode images; install it with '
                          'pip install Pillow'.format(where)) from e
    return Image


def _read_pairs(path):
    """``[(image_path, int_label)]`` from a text file of 'path label' lines
    (the path may contain spaces; blank lines are skipped)."""
    pairs = []
    with open(path, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            fields = line.rsplit(None, 1)
            try:
                pairs.append((fields[0], int(fields[1])))
            except (IndexError, ValueError):
                raise ValueError('LabeledImageDataset: line {} of {} should be '
                                 '"<image path> <integer label>", got {!r}'
                                 .format(number, path, line)) from None
    return pairs


class LabeledImageDataset(DatasetMixin):
    """A dataset of ``(image, label)`` pairs read from image files.

    Args:
        pairs: a list of ``(path, label)`` pairs, or the path of a text file
            with one ``<path> <label>`` pair per line.
        root: the folder image paths are relative to.
        dtype: dtype of the image arrays (values stay in ``[0, 255]``).
        label_dtype: dtype of the labels (0-d arrays).
        mode: a Pillow mode to convert to (``'RGB'``, ``'L'``), or None to
            keep each file's own channels.
        on_error: ``'raise'``: an unreadable image raises ValueError naming
            the file; ``'skip'``: it warns once per file, records the file
            in ``skipped`` and returns None (wrap the converter with
            ``minichain.dataset.drop_none`` to leave it out of the batch).
            An image larger than Pillow's ``Image.MAX_IMAGE_PIXELS`` (a
            decompression bomb: a small file that decodes to gigabytes)
            counts as unreadable.
        ignore_label: labels must be ``>= 0``; a label equal to this value
            (e.g. -1, for examples a loss should skip) is allowed too.

    Returns (per example):
        ``(image, label)``: image of shape ``(C, H, W)`` (``C = 1`` for
        grayscale), label a 0-d array.

    Attributes:
        skipped: paths of the images skipped so far (``on_error='skip'``).
    """

    def __init__(self, pairs, root='.', dtype=numpy.float32,
                 label_dtype=numpy.int32, mode=None, on_error='raise',
                 ignore_label=None):
        name = type(self).__name__
        self._image = _import_pil(name)
        if on_error not in ('raise', 'skip'):
            raise ValueError("{}: on_error must be 'raise' or 'skip', got {!r}"
                             .format(name, on_error))
        source = pairs if isinstance(pairs, (str, os.PathLike)) else None
        if source is not None:
            pairs = _read_pairs(pairs)
        self._pairs = [(os.fspath(p), int(t)) for p, t in pairs]
        for path, label in self._pairs:
            if label < 0 and label != ignore_label:
                raise ValueError(
                    '{}: image {}{} has the negative label {}; labels are '
                    'class indices >= 0 (pass ignore_label={} if it marks '
                    'examples to skip)'.format(
                        name, path, ' in {}'.format(source) if source else '',
                        label, label))
        self._root = os.fspath(root)
        self._dtype = numpy.dtype(dtype)
        self._label_dtype = numpy.dtype(label_dtype)
        self._mode = mode
        self._on_error = on_error
        self.skipped = []

    def __len__(self):
        return len(self._pairs)

    def __getstate__(self):  # picklable for loader workers: Pillow is a module
        state = dict(self.__dict__)
        del state['_image']
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._image = _import_pil(type(self).__name__)

    @property
    def n_skipped(self):
        """How many distinct images were skipped so far."""
        return len(self.skipped)

    @property
    def pairs(self):
        """The ``(path, label)`` pairs (paths relative to ``root``)."""
        return list(self._pairs)

    def get_example(self, i):
        """``(image, label)`` of pair ``i``; None for an unreadable image
        when ``on_error='skip'``."""
        path, label = self._pairs[i]
        full = os.path.join(self._root, path)
        Image = self._image
        try:
            with warnings.catch_warnings():
                # Above MAX_IMAGE_PIXELS Pillow only warns (twice that:
                # an error): decoding would still take gigabytes.
                warnings.simplefilter('error', Image.DecompressionBombWarning)
                with Image.open(full) as img:
                    if self._mode is not None:
                        img = img.convert(self._mode)
                    image = numpy.asarray(img, dtype=self._dtype)
        except FileNotFoundError:
            raise
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError,
                Image.DecompressionBombWarning) as e:
            message = '{}: cannot decode image {} ({}: {})'.format(
                type(self).__name__, full, type(e).__name__, e)
            if self._on_error == 'raise':
                raise ValueError(message) from e
            if full not in self.skipped:
                self.skipped.append(full)
                warnings.warn(message + '; skipped')
            return None
        image = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
        return image, numpy.array(label, dtype=self._label_dtype)


class ImageFolderDataset(LabeledImageDataset):
    """Images laid out as ``root/<class>/<image>`` (ImageNet's layout).

    Classes are the sub-folders of ``root`` in sorted order, labelled
    0, 1, ...; each class's images (files with a known image extension,
    any case) are taken in sorted order. An empty class folder keeps its
    label and triggers a warning.

    Args:
        root: the dataset folder.
        dtype, label_dtype, on_error: as for ``LabeledImageDataset``.
        mode: Pillow mode every image is converted to (default ``'RGB'``,
            so that every example has 3 channels).
        extensions: file name endings counted as images.

    Attributes:
        classes: the class names, index = label.
    """

    def __init__(self, root, dtype=numpy.float32, label_dtype=numpy.int32,
                 mode='RGB', on_error='raise', extensions=IMAGE_EXTENSIONS):
        name = type(self).__name__
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise FileNotFoundError('{}: {} is not a folder'.format(name,
                                                                    root))
        self.classes = sorted(d.name for d in os.scandir(root)
                              if d.is_dir() and not d.name.startswith('.'))
        if not self.classes:
            raise ValueError('{}: {} has no class sub-folders (expected '
                             'root/<class>/<image>)'.format(name, root))
        extensions = tuple(e.lower() for e in extensions)
        pairs = []
        for label, cls in enumerate(self.classes):
            folder = os.path.join(root, cls)
            files = sorted(f.name for f in os.scandir(folder) if f.is_file()
                           and f.name.lower().endswith(extensions))
            if not files:
                warnings.warn('{}: class folder {} has no images; label {} '
                              'will never occur'.format(name, folder, label))
            pairs += [(os.path.join(cls, f), label) for f in files]
        if not pairs:
            raise ValueError('{}: no images with extensions {} under {}'
                             .format(name, ', '.join(extensions), root))
        super().__init__(pairs, root, dtype, label_dtype, mode, on_error)

    @property
    def class_to_index(self):
        """``{class name: label}``."""
        return {cls: i for i, cls in enumerate(self.classes)}
