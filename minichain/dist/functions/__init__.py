"""ChainerMN's ``chainermn.functions``: communication as differentiable
functions, for models split over processes (model parallelism).

* :mod:`.point_to_point`: ``send`` and ``recv`` (the backward of each is
  the opposite message) and ``pseudo_connect``;
* :mod:`.collective`: ``bcast``, ``gather``, ``scatter``, ``allgather``
  and ``alltoall`` (the backward of each is the opposite collective).

:class:`minichain.dist.MultiNodeChainList` builds a model out of pieces
joined by them; docs/model_parallel.md walks through both passes.
"""
from minichain.dist.functions.collective import (  # noqa: F401
    allgather, alltoall, bcast, gather, scatter)
from minichain.dist.functions.point_to_point import (  # noqa: F401
    pseudo_connect, recv, send)

__all__ = ['allgather', 'alltoall', 'bcast', 'gather', 'pseudo_connect',
           'recv', 'scatter', 'send']
