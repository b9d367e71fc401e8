"""Converters: a list of examples -> batched arrays on a device."""
import numbers

import numpy

from minichain import backend

__all__ = ['concat_examples', 'to_device', 'drop_none']


def to_device(device, x):
    """Send ``x`` (an array, or a list/tuple of them) to ``device``.

    Args:
        device: None (leave ``x`` where it is) or any spec ``get_device``
            accepts (``-1``, ``'@numpy'``, ``0``, ``'@cupy:0'``, a Device).
        x: the array(s).
    """
    if device is None:
        return x
    from minichain.device import get_device
    return get_device(device).send(x)


def _stack(arrays, padding, where):
    """Stack same-shaped examples along a new first axis; with ``padding``,
    examples of different shapes are padded to the largest per axis."""
    first = arrays[0]
    if not backend.is_array(first):
        try:
            return numpy.asarray(arrays)
        except ValueError as e:
            raise ValueError('concat_examples: {} could not be made into '
                             'one array ({})'.format(where, e)) from None
    xp = backend.get_array_module(first)
    if padding is None:
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise ValueError('concat_examples: {} have different shapes {}; '
                             'pass padding= to pad them'.format(
                                 where, sorted(shapes)))
        return xp.stack(arrays)
    ndims = {a.ndim for a in arrays}
    if len(ndims) > 1:
        raise ValueError('concat_examples: {} have different numbers of axes '
                         '{}; padding cannot fix that'.format(
                             where, sorted(ndims)))
    shape = tuple(max(sizes) for sizes in zip(*(a.shape for a in arrays)))
    out = xp.full((len(arrays),) + shape, padding, dtype=first.dtype)
    for i, a in enumerate(arrays):
        out[(i,) + tuple(slice(s) for s in a.shape)] = a
    return out


def _per_field(padding, key):
    return padding[key] if isinstance(padding, (tuple, list, dict)) else padding


def concat_examples(batch, device=None, padding=None):
    """Batch a list of examples into arrays (the default converter).

    - examples that are tuples ``(x, t)`` give a tuple ``(X, T)`` where
      ``X`` stacks every ``x`` along a new first axis;
    - examples that are dicts give a dict of stacked arrays;
    - examples that are arrays (or scalars) give one stacked array.

    Scalars (e.g. int labels) become a 1-d array of their common dtype.

    Args:
        batch: a non-empty list of examples.
        device: where to put the result; None leaves arrays where they are
            (see ``to_device``).
        padding: None (shapes must match) or a fill value used to pad
            examples up to the largest shape along each axis; a tuple or
            dict gives one value per field.

    Returns:
        a tuple, dict or array of batched arrays, on ``device``.
    """
    if len(batch) == 0:
        raise ValueError('concat_examples: the batch is empty')
    for i, example in enumerate(batch):
        if example is None:
            raise ValueError(
                'concat_examples: example {} of the batch is None (a dataset '
                "with on_error='skip' dropped it); wrap the converter with "
                'minichain.dataset.drop_none'.format(i))
    first = batch[0]
    if isinstance(first, tuple):
        if any(len(ex) != len(first) for ex in batch):
            raise ValueError('concat_examples: examples are tuples of '
                             'different lengths')
        return tuple(to_device(device, _stack(
            [ex[j] for ex in batch], _per_field(padding, j),
            'field {} of the examples'.format(j))) for j in range(len(first)))
    if isinstance(first, dict):
        return {key: to_device(device, _stack(
            [ex[key] for ex in batch], _per_field(padding, key),
            'field {!r} of the examples'.format(key)))
            for key in first}
    if not (backend.is_array(first) or isinstance(first, numbers.Number)):
        raise TypeError('concat_examples: examples must be arrays, scalars, '
                        'tuples or dicts, got {}'.format(type(first).__name__))
    return to_device(device, _stack(batch, padding, 'the examples'))


def drop_none(converter=concat_examples):
    """Wrap ``converter`` so that None examples are left out of each batch.

    Use it with datasets that return None for examples they could not read
    (``LabeledImageDataset(..., on_error='skip')``). A batch made only of
    None raises ValueError.

    Returns:
        a converter with the signature ``(batch, device=None, **kwargs)``.
    """
    def convert(batch, device=None, **kwargs):
        kept = [example for example in batch if example is not None]
        if not kept:
            raise ValueError('drop_none: every example of the batch of {} '
                             'is None'.format(len(batch)))
        return converter(kept, device, **kwargs)
    return convert
