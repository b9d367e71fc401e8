"""Small float64 models for the distributed tests (importable by workers)."""
import numpy

import minichain
from minichain import functions as F
from minichain import links as L


def as_float64(model):
    """Cast every parameter and array persistent of ``model`` to float64."""
    for _, p in model.namedparams():
        if p.array is not None:
            p.array = p.array.astype(numpy.float64)
    for _, link in model.namedlinks():
        for name in link._persistent:
            v = getattr(link, name)
            if hasattr(v, 'dtype'):
                setattr(link, name, v.astype(numpy.float64))
        if isinstance(link, L.BatchNormalization):
            link._dtype = numpy.dtype(numpy.float64)
    return model


class MLP(minichain.Chain):
    """Linear-tanh-Linear (the second layer lazily initialized)."""

    def __init__(self, n_in=5, n_hidden=7, n_out=3):
        super().__init__()
        with self.init_scope():
            self.l1 = L.Linear(n_in, n_hidden)
            self.l2 = L.Linear(n_hidden, n_out)

    def forward(self, x):
        return self.l2(F.tanh(self.l1(x)))


class ConvNet(minichain.Chain):
    """conv-relu-conv-pool-linear, no batch normalization."""

    def __init__(self, n_out=3):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(2, 4, 3, pad=1)
            self.c2 = L.Convolution2D(4, 4, 3, stride=2, pad=1)
            self.fc = L.Linear(4, n_out)

    def forward(self, x):
        h = F.relu(self.c2(F.relu(self.c1(x))))
        return self.fc(F.average_pooling_2d(h, 2))


class Block(minichain.Chain):
    """conv-BN-relu-conv-BN plus the identity, then relu."""

    def __init__(self, ch):
        super().__init__()
        with self.init_scope():
            self.c1 = L.Convolution2D(ch, ch, 3, pad=1, nobias=True)
            self.b1 = L.BatchNormalization(ch, dtype=numpy.float64)
            self.c2 = L.Convolution2D(ch, ch, 3, pad=1, nobias=True)
            self.b2 = L.BatchNormalization(ch, dtype=numpy.float64)

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(h)) + x)


class TinyResNet(minichain.Chain):
    """A stem conv+BN, two residual blocks, global pooling, a classifier."""

    def __init__(self, ch=4, n_out=3):
        super().__init__()
        with self.init_scope():
            self.stem = L.Convolution2D(2, ch, 3, pad=1, nobias=True)
            self.bn = L.BatchNormalization(ch, dtype=numpy.float64)
            self.blocks = minichain.Sequential(Block(ch), Block(ch))
            self.fc = L.Linear(ch, n_out)

    def forward(self, x):
        h = F.relu(self.bn(self.stem(x)))
        h = self.blocks(h)
        return self.fc(F.global_average_pooling_2d(h))


def seeded(cls, seed, *args):
    """Build ``cls(*args)`` in float64 with initial values from ``seed``."""
    model = as_float64(cls(*args))
    rng = numpy.random.default_rng(seed)
    for _, p in model.namedparams():
        if p.array is not None and p.array.ndim > 1:
            p.array[...] = rng.standard_normal(p.shape) * (
                1.0 / numpy.sqrt(p.array[0].size))
    return model


class SharedUnused(minichain.Chain):
    """A layer applied twice (a shared weight), then a classifier; and a
    parameter that no forward uses."""

    def __init__(self, n_in=5, n_out=3):
        super().__init__()
        with self.init_scope():
            self.shared = L.Linear(n_in, n_in)
            self.out = L.Linear(n_in, n_out)
            self.unused = minichain.Parameter(numpy.zeros(4))

    def forward(self, x):
        h = F.tanh(self.shared(x))
        return self.out(F.tanh(self.shared(h)))


class Flat(minichain.Link):
    """Parameters ``p0, p1, ...`` of the 1-d ``sizes`` (zeros of
    ``dtype``): a model that is only its gradients' layout."""

    def __init__(self, sizes, dtype):
        super().__init__()
        with self.init_scope():
            for i, n in enumerate(sizes):
                setattr(self, 'p{}'.format(i), minichain.Parameter(
                    numpy.zeros(n, dtype)))
