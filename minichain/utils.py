"""Chainer's ``chainer.utils``: the helpers that Chainer and ChainerMN
programs call (``experimental``, ``size_of_shape``, ``force_array``)."""
import math
import warnings

import numpy

__all__ = ['experimental', 'force_array', 'size_of_shape']


def experimental(api_name):
    """Warn (FutureWarning, as Chainer) that ``api_name`` is experimental,
    unless ``minichain.disable_experimental_feature_warning`` is True
    (ChainerMN's examples set ``chainer.disable_experimental_feature_warning
    = True``)."""
    import minichain
    if not getattr(minichain, 'disable_experimental_feature_warning', False):
        warnings.warn('{} is experimental. Its interface may change in the '
                      'future.'.format(api_name), FutureWarning, stacklevel=2)


def size_of_shape(shape):
    """The number of elements of an array of ``shape`` (1 for ``()``)."""
    return math.prod(int(n) for n in shape)


def force_array(x, dtype=None):
    """``x`` as an ndarray (NumPy reductions return scalars), cast to
    ``dtype`` if given."""
    if numpy.isscalar(x) or isinstance(x, numpy.generic):
        return numpy.asarray(x, dtype)
    return x if dtype is None else x.astype(dtype, copy=False)
