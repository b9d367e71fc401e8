"""ChainerMN's ``chainermn.communicators`` paths.

``create_communicator`` and ``CommunicatorBase``, and the modules of
ChainerMN's communicator classes, one attribute each::

    chainermn.communicators.naive_communicator.NaiveCommunicator
    chainermn.communicators.flat_communicator.FlatCommunicator
    chainermn.communicators.pure_nccl_communicator.PureNcclCommunicator
    chainermn.communicators.non_cuda_aware_communicator.NonCudaAwareCommunicator
    chainermn.communicators.mpi_communicator_base.MpiCommunicatorBase
    chainermn.communicators.communicator_base.CommunicatorBase

ChainerMN code builds communicators from these classes too. Each class here
is minichain's with the layers :func:`minichain.dist.create_communicator`
puts in front (the guards, the timeline), so a communicator built from it
is watched as one made by name: an error on one rank is raised on every
rank, and no rank waits for ever (the bare classes, ``minichain.dist.naive.
NaiveCommunicator`` and the others, are the protocol alone). NCCL without
CUDA-aware MPI, ChainerMN's ``non_cuda_aware``, is minichain's
``hierarchical``: NCCL inside a node, MPI between nodes, through the host.
"""
import sys
import types

from minichain.dist import _communicator_class
from minichain.dist import create_communicator  # noqa: F401
from minichain.dist.communicator_base import CommunicatorBase

# ChainerMN module -> (its class name, the name create_communicator takes)
_CLASSES = {
    'naive_communicator': ('NaiveCommunicator', 'naive'),
    'flat_communicator': ('FlatCommunicator', 'flat'),
    'pure_nccl_communicator': ('PureNcclCommunicator', 'pure_nccl'),
    'non_cuda_aware_communicator': ('NonCudaAwareCommunicator',
                                    'non_cuda_aware'),
}


def _module(name, **attributes):
    """A module ``minichain.dist.communicators.<name>`` holding
    ``attributes`` (what ``import chainermn.communicators.<name>`` gives)."""
    module = types.ModuleType(__name__ + '.' + name)
    module.__dict__.update(attributes)
    sys.modules[module.__name__] = module
    globals()[name] = module


for _name, (_cls, _ours) in _CLASSES.items():
    _module(_name, **{_cls: _communicator_class(_ours)})
_module('communicator_base', CommunicatorBase=CommunicatorBase)
# ChainerMN's base of its MPI communicators: every minichain communicator
# talks MPI through CommunicatorBase.
_module('mpi_communicator_base', MpiCommunicatorBase=CommunicatorBase)
