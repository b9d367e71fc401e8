"""ChainerMN's ``chainermn.links`` path: the data-parallel links.

``from minichain.dist import links`` (or ``minichain.dist.links.X`` after
``from minichain import dist``) gives what ``chainermn.links`` gives that
minichain has: synchronized batch normalization and the helper that swaps it
into a model. ``MultiNodeChainList`` (model parallelism) is not here.
"""
from minichain.dist.batch_normalization import (  # noqa: F401
    MultiNodeBatchNormalization, create_mnbn_model)

__all__ = ['MultiNodeBatchNormalization', 'create_mnbn_model']
