"""ResNet for minichain: ResNet-18/34/50/101/152 and a small-input stem.

The layout follows He et al. (2016) with the stride on the 3x3 convolution of
each bottleneck ("ResNet v1.5", as torchvision and most reference trainings
use): convolutions carry no bias because batch normalization follows them,
weights are He-normal, and each stage's first block projects the shortcut with
a 1x1 convolution whenever the shape changes. ``ResNet50(1000)`` has exactly
25,557,032 parameters.

``stem='imagenet'`` is the usual 7x7/2 convolution and 3x3/2 max pooling for
224 px inputs; ``stem='small'`` is one 3x3 stride-1 convolution without
pooling for 28-32 px images (CIFAR, Fashion-MNIST), where the ImageNet stem
would shrink the map to 1x1 before the last stage. ``stem='small2'`` is a 3x3
stride-2 convolution: four times cheaper than 'small' on 28 px images, and
what trains Fashion-MNIST best per second on a CPU.
"""
import minichain
from minichain import functions as F
from minichain import initializers
from minichain import links as L

# (block class name, blocks per stage) for each depth.
ARCHS = {
    'resnet18': ('basic', (2, 2, 2, 2)),
    'resnet34': ('basic', (3, 4, 6, 3)),
    'resnet50': ('bottleneck', (3, 4, 6, 3)),
    'resnet101': ('bottleneck', (3, 4, 23, 3)),
    'resnet152': ('bottleneck', (3, 8, 36, 3)),
}
STEMS = ('imagenet', 'small', 'small2')


def _conv(in_ch, out_ch, ksize, stride=1, pad=0):
    return L.Convolution2D(in_ch, out_ch, ksize, stride=stride, pad=pad,
                           nobias=True, initialW=initializers.HeNormal())


class _ResidualBlock(minichain.Chain):
    """``relu(residual(x) + shortcut(x))``: the shortcut is the identity, or
    a 1x1 convolution and batch norm (``proj``, ``bn_proj``) where the
    block changes the shape. Subclasses build ``residual``'s layers in
    ``__init__`` and then call :meth:`add_shortcut`; ``residual(x, s)``
    ends with ``bn(h, residual=s, relu=True)``, which computes
    ``relu(bn(h) + s)`` in one pass (``F.batch_normalization``)."""

    def add_shortcut(self, in_ch, out_ch, stride):
        """Register the projection when stride or channels change."""
        if stride != 1 or in_ch != out_ch:
            with self.init_scope():
                self.proj = _conv(in_ch, out_ch, 1, stride)
                self.bn_proj = L.BatchNormalization(out_ch)

    def shortcut(self, x):
        if hasattr(self, 'proj'):
            return self.bn_proj(self.proj(x))
        return x

    def forward(self, x):
        return self.residual(x, self.shortcut(x))


class BasicBlock(_ResidualBlock):
    """Two 3x3 convolutions (ResNet-18/34); ``expansion`` = 1."""

    expansion = 1

    def __init__(self, in_ch, mid_ch, stride=1):
        super().__init__()
        out_ch = mid_ch * self.expansion
        with self.init_scope():
            self.conv1 = _conv(in_ch, mid_ch, 3, stride, 1)
            self.bn1 = L.BatchNormalization(mid_ch)
            self.conv2 = _conv(mid_ch, out_ch, 3, 1, 1)
            self.bn2 = L.BatchNormalization(out_ch)
        self.add_shortcut(in_ch, out_ch, stride)

    def residual(self, x, shortcut):
        h = self.bn1(self.conv1(x), relu=True)
        return self.bn2(self.conv2(h), residual=shortcut, relu=True)


class Bottleneck(_ResidualBlock):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4."""

    expansion = 4

    def __init__(self, in_ch, mid_ch, stride=1):
        super().__init__()
        out_ch = mid_ch * self.expansion
        with self.init_scope():
            self.conv1 = _conv(in_ch, mid_ch, 1)
            self.bn1 = L.BatchNormalization(mid_ch)
            self.conv2 = _conv(mid_ch, mid_ch, 3, stride, 1)
            self.bn2 = L.BatchNormalization(mid_ch)
            self.conv3 = _conv(mid_ch, out_ch, 1)
            self.bn3 = L.BatchNormalization(out_ch)
        self.add_shortcut(in_ch, out_ch, stride)

    def residual(self, x, shortcut):
        h = self.bn1(self.conv1(x), relu=True)
        h = self.bn2(self.conv2(h), relu=True)
        return self.bn3(self.conv3(h), residual=shortcut, relu=True)


class ResNet(minichain.Chain):
    """A residual network; calling it on (N, C, H, W) returns (N, n_classes) logits.

    Args:
        arch: one of ``ARCHS`` ('resnet50' by default).
        n_classes: size of the final linear layer.
        stem: 'imagenet', 'small' or 'small2' (see the module docstring).
        in_channels: image channels (3 for RGB, 1 for grey).
    """

    def __init__(self, arch='resnet50', n_classes=1000, stem='imagenet',
                 in_channels=3):
        super().__init__()
        if arch not in ARCHS:
            raise ValueError('ResNet: unknown arch {!r}; choose one of {}'
                             .format(arch, ', '.join(sorted(ARCHS))))
        if stem not in STEMS:
            raise ValueError('ResNet: unknown stem {!r}; choose one of {}'
                             .format(stem, ', '.join(STEMS)))
        kind, counts = ARCHS[arch]
        block = Bottleneck if kind == 'bottleneck' else BasicBlock
        self.arch, self.stem = arch, stem
        with self.init_scope():
            if stem == 'imagenet':
                self.conv1 = _conv(in_channels, 64, 7, 2, 3)
            else:
                self.conv1 = _conv(in_channels, 64, 3,
                                   1 if stem == 'small' else 2, 1)
            self.bn1 = L.BatchNormalization(64)
            in_ch = 64
            for i, (n, mid) in enumerate(zip(counts, (64, 128, 256, 512))):
                stage = minichain.ChainList()
                for j in range(n):
                    stride = 2 if (i > 0 and j == 0) else 1
                    stage.append(block(in_ch, mid, stride))
                    in_ch = mid * block.expansion
                setattr(self, 'res{}'.format(i + 2), stage)
            self.fc = L.Linear(in_ch, n_classes)

    def features(self, x):
        """The pooled (N, 512 * expansion) features before the classifier."""
        h = self.bn1(self.conv1(x), relu=True)
        if self.stem == 'imagenet':
            h = F.max_pooling_2d(h, 3, stride=2, pad=1, cover_all=False)
        for name in ('res2', 'res3', 'res4', 'res5'):
            for block in getattr(self, name):
                h = block(h)
        return F.global_average_pooling_2d(h)

    def forward(self, x):
        return self.fc(self.features(x))


def ResNet50(n_classes=1000, stem='imagenet', in_channels=3):
    """ResNet-50 (bottleneck blocks 3, 4, 6, 3)."""
    return ResNet('resnet50', n_classes, stem, in_channels)


def loss_and_accuracy(model, x, t):
    """Softmax cross-entropy of ``model(x)`` against labels ``t``; reports
    ``loss`` and ``accuracy`` to the current reporter when one is active.

    Returns:
        the loss Variable (a scalar).
    """
    y = model(x)
    loss = F.softmax_cross_entropy(y, t)
    acc = F.accuracy(y, t)
    report = getattr(minichain, 'report', None)
    if report is not None:
        report({'loss': loss, 'accuracy': acc}, model)
    return loss
