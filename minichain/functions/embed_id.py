"""The embedding's function: embed_id (row ``x[i]`` of ``W``)."""
import numpy

from minichain import backend
from minichain.configuration import config
from minichain.function_node import FunctionNode
from minichain.functions._check import check_float, unwrap

__all__ = ['embed_id']


def _ignored(x, ignore_label):
    """The mask of ids equal to ``ignore_label`` (None: no id)."""
    return None if ignore_label is None else x == ignore_label


class EmbedIDFunction(FunctionNode):
    """``y[...] = W[x[...]]`` (zeros where ``x == ignore_label``); inputs
    ``(x, W)``, ``x`` integer ids."""

    def __init__(self, ignore_label=None):
        self.ignore_label = ignore_label

    def forward(self, inputs):
        self.retain_inputs((0,))
        x, W = inputs
        self.n_ids = len(W)
        mask = _ignored(x, self.ignore_label)
        if mask is None:
            return W[x],
        xp = backend.get_array_module(W)
        y = W[xp.where(mask, 0, x)]
        y[mask] = 0
        return y,

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        gW, = EmbedIDGrad(self.n_ids, self.ignore_label).apply(
            (x, grad_outputs[0]))
        return None, gW


class EmbedIDGrad(FunctionNode):
    """``gW[i] = sum of gy[...] where x[...] == i``; inputs ``(x, gy)``.
    Hand-written: a scatter-add, which no function expresses; its own
    backward is embed_id again."""

    def __init__(self, n_ids, ignore_label):
        self.n_ids, self.ignore_label = n_ids, ignore_label

    def forward(self, inputs):
        self.retain_inputs((0,))
        x, gy = inputs
        xp = backend.get_array_module(gy)
        gW = xp.zeros((self.n_ids,) + gy.shape[x.ndim:], gy.dtype)
        mask = _ignored(x, self.ignore_label)
        keep = slice(None) if mask is None else ~mask
        xp.add.at(gW, x[keep], gy[keep])
        return gW,

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        return None, embed_id(x, grad_outputs[0], self.ignore_label)


def embed_id(x, W, ignore_label=None):
    """Look up embeddings: ``y[...] = W[x[...]]``.

    Args:
        x: integer ids of any shape, each in ``[0, len(W))`` (or equal to
            ``ignore_label``); not differentiated.
        W: float embeddings of shape ``(n_ids, n_units)``.
        ignore_label: an id whose rows of ``y`` are zeros (and give ``W`` no
            gradient); None: none.
    Returns:
        Variable of shape ``x.shape + (n_units,)``.
    """
    xa, Wa = unwrap(x), check_float('embed_id', W, 'W')
    if xa.dtype.kind not in 'iu':
        raise TypeError('embed_id: x must hold integer ids, got dtype {}'
                        .format(xa.dtype))
    if Wa.ndim != 2:
        raise ValueError('embed_id: W must be 2-D (n_ids, n_units), got '
                         'shape {}'.format(Wa.shape))
    # An id out of range would wrap (-1 is the last row) or fail in
    # indexing without a word of embed_id. Checked on the host always, on
    # a GPU under config.debug only (the check waits for the device).
    if backend.get_array_module(xa) is numpy or config.debug:
        ids = xa if ignore_label is None else xa[xa != ignore_label]
        if ids.size and not (0 <= int(ids.min()) and
                             int(ids.max()) < len(Wa)):
            raise ValueError(
                'embed_id: ids must lie in [0, {}) (W of shape {}){}, got '
                '{} to {} in x of shape {}'.format(
                    len(Wa), Wa.shape, '' if ignore_label is None else
                    ' or equal ignore_label={}'.format(ignore_label),
                    int(ids.min()), int(ids.max()), xa.shape))
    return EmbedIDFunction(ignore_label).apply((x, W))[0]
