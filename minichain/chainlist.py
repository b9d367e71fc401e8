"""ChainList and Sequential: child links kept in a list, named '0', '1', ..."""
from minichain.link import Link


class ChainList(Link):
    """A link holding an ordered list of child links, named '0', '1', ...

    Args:
        links: initial children, appended in order.
    """

    def __init__(self, *links):
        super().__init__()
        self._children = []
        for link in links:
            self.append(link)

    def append(self, link):
        """Add ``link`` as the next child."""
        if not isinstance(link, Link):
            raise TypeError('{}.append: expected a Link, got {}'.format(
                type(self).__name__, type(link).__name__))
        link.name = str(len(self._children))
        self._children.append(link)

    def add_link(self, link):
        """Chainer's name for ``append``."""
        self.append(link)

    def __getitem__(self, index):
        return self._children[index]

    def __len__(self):
        return len(self._children)

    def __iter__(self):
        return iter(self._children)

    def _named_children(self):
        return [(str(i), c) for i, c in enumerate(self._children)]


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
