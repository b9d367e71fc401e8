"""ChainerMN's ``chainermn.links`` path: the data-parallel links.

``from minichain.dist import links`` (or ``minichain.dist.links.X`` after
``from minichain import dist``) gives what ``chainermn.links`` gives that
minichain has: synchronized batch normalization and the helper that swaps it
into a model, and the model split over processes, ``MultiNodeChainList``.
"""
from minichain.dist.batch_normalization import (  # noqa: F401
    MultiNodeBatchNormalization, create_mnbn_model)
from minichain.dist.multi_node_chain_list import (  # noqa: F401
    MultiNodeChainList)

__all__ = ['MultiNodeBatchNormalization', 'MultiNodeChainList',
           'create_mnbn_model']
