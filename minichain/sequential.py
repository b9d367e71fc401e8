"""Sequential: layers called one after another (as chainer.Sequential).

A ChainList whose children are the links among its layers, and whose
forward feeds each layer's output to the next; plain callables such as
``F.relu`` sit between them without being registered.
"""
from minichain.link import ChainList, Link


class Sequential(ChainList):
    """Layers called one after another: ``Sequential(l1, F.relu, l2)(x)``.

    Args:
        layers: links (registered as children '0', '1', ... in order of
            appearance among the links) or plain callables such as
            ``F.relu`` (called, not registered).
    """

    def __init__(self, *layers):
        super().__init__()
        self._layers = []
        for layer in layers:
            self.append(layer)

    def append(self, layer):
        """Add ``layer`` (a link or a callable) at the end."""
        if isinstance(layer, Link):
            super().append(layer)
        elif not callable(layer):
            raise TypeError('Sequential: a layer must be a Link or a '
                            'callable, got {}'.format(type(layer).__name__))
        self._layers.append(layer)

    def __getitem__(self, index):
        return self._layers[index]

    def __len__(self):
        return len(self._layers)

    def __iter__(self):
        return iter(self._layers)

    def forward(self, *args):
        """Feed ``args`` to the first layer and each output to the next."""
        if not self._layers:
            raise ValueError('Sequential.forward: no layers')
        out = self._layers[0](*args)
        for layer in self._layers[1:]:
            out = layer(out)
        return out

    def __repr__(self):
        lines = ['Sequential(']
        for i, layer in enumerate(self._layers):
            body = repr(layer) if isinstance(layer, Link) else getattr(
                layer, '__name__', repr(layer))
            lines.append('  ({}): {},'.format(i, body.replace('\n', '\n  ')))
        return '\n'.join(lines) + '\n)'
