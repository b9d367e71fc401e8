"""Evaluation metrics (not differentiable): accuracy."""
from minichain import backend
from minichain.configuration import no_backprop_mode
from minichain.function_node import FunctionNode
from minichain.functions._check import check_array, unwrap

__all__ = ['accuracy']


class Accuracy(FunctionNode):
    """Fraction of positions where ``argmax(y, axis=1) == t``.

    Applied without recording a graph: the result is a metric, not a loss.
    """

    def __init__(self, ignore_label):
        self.ignore_label = ignore_label

    def forward(self, inputs):
        y, t = inputs
        xp = backend.get_array_module(y)
        correct = y.argmax(axis=1) == t
        if self.ignore_label is None:
            return xp.asarray(correct.mean(), dtype=y.dtype),
        valid = t != self.ignore_label
        # Kept on the device (no sync); every label ignored gives 0.
        total = xp.maximum(valid.sum(), 1)
        return xp.asarray((correct & valid).sum() / total, dtype=y.dtype),

    def backward(self, indexes, grad_outputs):
        raise RuntimeError('accuracy is an evaluation metric and has no '
                           'gradient')


def accuracy(y, t, ignore_label=None):
    """Classification accuracy: the mean of ``argmax(y, axis=1) == t``.

    Args:
        y: scores of shape (N, C) or (N, C, d1, ...) (any real dtype).
        t: integer labels of shape (N,) or (N, d1, ...).
        ignore_label: labels equal to it are left out of both the count of
            correct predictions and the total (0 when all are ignored).
    Returns:
        Variable of shape () with ``y``'s dtype (float64 for integer scores);
        it records no graph.
    """
    name = 'accuracy'
    ya, ta = check_array(name, y, 'y'), unwrap(t)
    if not backend.is_array(ta) or ta.dtype.kind not in 'iu':
        raise TypeError('{}: t must be an integer array, got {}'.format(
            name, getattr(ta, 'dtype', type(ta).__name__)))
    if ya.ndim < 2 or ta.shape != ya.shape[:1] + ya.shape[2:]:
        raise ValueError(
            '{}: y of shape {} (N, C, ...) needs t of shape (N, ...), got t '
            'of shape {}'.format(name, ya.shape, ta.shape))
    if ya.shape[0] == 0 or ya.shape[1] == 0:
        raise ValueError('{}: y of shape {} is empty'.format(name, ya.shape))
    if not backend.is_float(ya.dtype):
        ya = ya.astype('float64')
    with no_backprop_mode():
        return Accuracy(ignore_label).apply((ya, ta))[0]
