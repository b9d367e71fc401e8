"""minichain.links (imported as L): layers with parameters.

One family file each; a family lists its public names in ``__all__``.
"""
from minichain.links.linear import *  # noqa: F401,F403
from minichain.links.convolution import *  # noqa: F401,F403
from minichain.links.embed_id import *  # noqa: F401,F403
from minichain.links.normalization import BatchNormalization  # noqa: F401
from minichain.links.classifier import *  # noqa: F401,F403
# Sequential lives beside Chain (minichain.Sequential, as chainer.Sequential);
# it is a link that holds links, so L.Sequential names it too.
from minichain.sequential import Sequential  # noqa: F401
