"""The embedding layer: L.EmbedID."""
from minichain import functions as F
from minichain import initializers
from minichain.link import Link
from minichain.variable import Parameter

__all__ = ['EmbedID']


class EmbedID(Link):
    """Word embeddings: ``y = W[x]`` for integer ids ``x``.

    Args:
        in_size: the number of ids (rows of ``W``).
        out_size: the size of each embedding.
        initialW: initializer, scalar or array for ``W``; default
            ``Normal(1.0)``, as in Chainer.
        ignore_label: an id mapped to zeros (and given no gradient).

    Attributes:
        W: Parameter of shape ``(in_size, out_size)``.
    """

    def __init__(self, in_size, out_size, initialW=None, ignore_label=None):
        super().__init__()
        self.ignore_label = ignore_label
        with self.init_scope():
            self.W = Parameter(initializers.get_initializer(
                initialW, default=initializers.Normal(1.0)))
            self.W.initialize((in_size, out_size))

    def forward(self, x):
        """The embeddings of the ids ``x``, shape ``x.shape + (out_size,)``."""
        return F.embed_id(x, self.W, self.ignore_label)
